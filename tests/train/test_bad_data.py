"""Bad data values (issue 11, items 8 and 11c): every unusable data file names the file, the line
or row and the real fix, with exit code 2; prompts cut by data.max_prompt_length are counted
and reported once."""

from __future__ import annotations

import json

import pytest

from rltune.data import DataError, load_prompts
from rltune.recipe.schema import DataCfg


def _load(tmp_path, name: str, content, **kw):
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return load_prompts(str(p), **kw)


def _fails(tmp_path, name, content, *needles, **kw):
    with pytest.raises(DataError) as ei:
        _load(tmp_path, name, content, **kw)
    assert ei.value.exit_code == 2
    msg = str(ei.value)
    assert str(tmp_path / name) in msg and "\n  fix: " in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_non_utf8_byte_names_line_and_column(tmp_path):
    _fails(tmp_path, "d.jsonl", b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9 1+2=", "answer": "3"}\n',
           "data.train: data file", "d.jsonl, line 2", "byte 0xe9 at column 16 is not UTF-8", "iconv")


def test_malformed_json_line_has_its_line_number(tmp_path):
    rows = "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(5))
    _fails(tmp_path, "d.jsonl", rows + '{"prompt": "9+1=", "answer": "10"\n' + rows,
           "d.jsonl, line 6", "not valid JSON", "Expecting ',' delimiter", "one complete JSON object")
    _fails(tmp_path, "e.jsonl", rows + '{"prompt": "9+1=", "ans', "e.jsonl, line 6", "the file may be cut off")
    _fails(tmp_path, "f.jsonl", rows + '["9+1=", "10"]\n', "f.jsonl, line 6", "a JSON array, not an object")


def test_integer_prompts(tmp_path):
    _fails(tmp_path, "d.jsonl", '{"prompt": "1+1="}\n{"prompt": 12}\n{"prompt": 13}\n',
           "d.jsonl, line 2", "'prompt' is a number (12), not text (and 1 more row like it)",
           'write it as a string: "prompt": "12"')


def test_prompt_list_of_ints(tmp_path):
    _fails(tmp_path, "d.jsonl", '{"prompt": [101, 2023, 102]}\n', "d.jsonl, line 1",
           "'prompt' is a list of numbers ([101, 2023, 102]): token ids are not accepted",
           '"role": "user"')
    _fails(tmp_path, "e.jsonl", '{"prompt": [{"role": "user"}]}\n', "e.jsonl, line 1",
           "message 1 of 'prompt' has no text 'content'")


def test_semicolon_csv_blames_the_delimiter_not_prompt_key(tmp_path):
    msg = _fails(tmp_path, "d.csv", "prompt;answer\n1+1=;2\n2+2=;4\n", "d.csv, line 1",
                 "separated by `;`", "comma-separated")
    assert "data.prompt_key" not in msg
    _fails(tmp_path, "t.csv", "prompt\tanswer\n1+1=\t2\n", "t.csv, line 1", "separated by tabs")
    # a comma CSV without the column still points at data.prompt_key
    _fails(tmp_path, "q.csv", "question,answer\n1+1=,2\n", "no column 'prompt'", "question", "data.prompt_key")


def test_csv_row_with_too_many_fields(tmp_path):
    _fails(tmp_path, "d.csv", "prompt,answer\n1+1=,2\nadd 1, 2,3\n", "d.csv, line 3", "3 fields, but the header has 2",
           "quote values that contain a comma")


def test_json_array_errors_name_the_line_or_row(tmp_path):
    _fails(tmp_path, "d.json", '[\n  {"prompt": "1+1="},\n  {"prompt": "2+2="\n]\n', "d.json, line 4", "not valid JSON")
    _fails(tmp_path, "e.json", '[{"prompt": "1+1="}, "2+2="]', "e.json, row 2", "a JSON string, not an object")
    _fails(tmp_path, "f.json", '[{"prompt": "1+1="}, {"prompt": ""}]', "f.json, row 2", "empty 'prompt'")


def test_eval_data_names_data_eval(tmp_path):
    _fails(tmp_path, "d.jsonl", '{"prompt": 1}\n', "data.eval: data file", split="eval")


def test_missing_and_odd_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    link = tmp_path / "loop.jsonl"
    link.symlink_to(link)
    with pytest.raises(DataError, match="symbolic link loop"):
        load_prompts(str(link))
    with pytest.raises(DataError, match="is a directory"):
        load_prompts(str(tmp_path))
    _fails(tmp_path, "d.txt", "1+1=\n", "unsupported extension '.txt'", ".jsonl")
    _fails(tmp_path, "bad.parquet", b"not parquet at all", "could not be read as parquet")


def test_good_files_still_load(tmp_path):
    ps = _load(tmp_path, "d.jsonl", '\ufeff{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "tag": "x"}\n')
    assert ps.rows == [{"prompt": "1+1=", "answer": "2", "tag": None}, {"prompt": "2+2=", "answer": None, "tag": "x"}]
    ps = _load(tmp_path, "d.csv", 'prompt,answer\n"add 1, 2",3\n2+2=,4\r\n')
    assert ps.rows == [{"prompt": "add 1, 2", "answer": "3"}, {"prompt": "2+2=", "answer": "4"}]
    ps = _load(tmp_path, "a.json", '[{"prompt": "1+1=", "answer": 2}]')
    assert ps.rows == [{"prompt": "1+1=", "answer": 2}]
    ps = _load(tmp_path, "c.json", '{"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}')
    assert [r["answer"] for r in ps.rows] == ["2", "4"]
    ps = _load(tmp_path, "l.json", '{"prompt": "1+1="}\n{"prompt": "2+2="}\n')
    assert len(ps) == 2
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}]
    ps = _load(tmp_path, "m.jsonl", json.dumps({"prompt": chat}) + "\n")
    assert ps.rows[0]["prompt"] == chat
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}), tmp_path / "p.parquet")
    assert load_prompts(str(tmp_path / "p.parquet")).rows[1] == {"prompt": "2+2=", "answer": "4"}
    pq.write_table(pa.table({"prompt": [1, 2]}), tmp_path / "i.parquet")
    with pytest.raises(DataError, match="column 'prompt' has type int64"):
        load_prompts(str(tmp_path / "i.parquet"))


# -- in a run: exit code 2, the message, no traceback ----------------------------------------

def test_train_on_bad_data_exits_2_with_the_line(capfd, recipe_factory, tmp_path):
    from trainlib import run_inproc

    data = tmp_path / "d.jsonl"
    data.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    res = run_inproc(capfd, "train", recipe_factory(data={"train": str(data)}, trainer__eval_every=0))
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "probably a bug" not in res.stderr
    assert f"data.train: data file {data}, line 2: byte 0xe9" in res.stderr and "fix: save the file as UTF-8" in res.stderr


# -- item 11c: prompts longer than data.max_prompt_length ------------------------------------

class _CharTokenizer:
    """One token per character, no chat template, no BOS."""

    chat_template = None
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_truncation_is_counted_once():
    from rltune.train.prompts import encode_prompt, truncation_warning

    cfg = DataCfg(train="x.jsonl", max_prompt_length=8)
    rows = [{"prompt": "1+1="}, {"prompt": "x" * 20}, {"prompt": "y" * 30}, {"prompt": "12345678"}]
    w = truncation_warning(rows, _CharTokenizer(), cfg, "prompt")
    assert w == ("data.train: 2 of 4 prompts are longer than data.max_prompt_length (8 tokens; the longest has 30) "
                 "and are left-truncated: the policy does not see their beginning\n"
                 "  fix: raise data.max_prompt_length to 30 (rollout.max_model_len and reward.max_length must then "
                 "hold it plus rollout.max_new_tokens), or shorten those prompts")
    assert encode_prompt(rows[2], _CharTokenizer(), cfg, "prompt") == [ord("y")] * 8  # still the last 8 tokens
    assert truncation_warning(rows[:1] + rows[3:], _CharTokenizer(), cfg, "prompt") is None
    many = [{"prompt": "z" * (9 if i % 10 == 0 else 3)} for i in range(10_000)]
    w = truncation_warning(many, _CharTokenizer(), cfg, "prompt", "data.eval")
    assert w.startswith("data.eval: 1000 of 2000 sampled prompts (of 10000) are longer")  # every 5th row


def test_train_warns_once_about_truncated_prompts(capfd, recipe_factory, tmp_path):
    from trainlib import run_inproc

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": ("please add " * (3 if i % 4 == 0 else 0)) + f"{i % 9}+1=",
                                        "answer": str(i % 9 + 1)}) + "\n" for i in range(64)))
    path = recipe_factory(data={"train": str(data), "max_prompt_length": 16}, trainer__max_steps=1,
                          trainer__eval_every=0)
    res = run_inproc(capfd, "train", path)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if "longer than data.max_prompt_length" in ln]
    assert len(lines) == 1, res.stderr[-3000:]
    assert "data.train: 16 of 64 prompts are longer than data.max_prompt_length (16 tokens" in lines[0]
    assert "fix: raise data.max_prompt_length to" in res.stderr


def test_partial_scan_reads_whole_lines_only(tmp_path):
    from rltune.data.datasets import read_rows

    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"{i}+1=" + "é" * 50}) + "\n" for i in range(200)))
    rows, where = read_rows(p, str(p), max_bytes=5000)       # cut inside a line and a character
    assert 0 < len(rows) < 200 and where[-1] == f"line {len(rows)}"
    p.write_text(json.dumps({"prompt": "x" * 10_000}) + "\n")
    assert read_rows(p, str(p), max_bytes=5000) == ([], [])  # one long line: nothing to judge early
    c = tmp_path / "d.csv"
    c.write_text("prompt,answer\n" + "".join(f'"{i}+1=\nplease",{i + 1}\n' for i in range(300)))
    rows, _ = read_rows(c, str(c), max_bytes=2000)
    assert rows and all(r["prompt"].endswith("please") for r in rows)


def test_a_lone_surrogate_escape_in_a_json_prompt_trains_as_the_replacement_character(tmp_path):
    """JSON's "\\ud800" escapes decode to lone UTF-16 surrogates, which no tokenizer takes (a TypeError
    at the first step, in prompt, chat message and column alike): the rows carry U+FFFD instead, and a
    run on such a file trains."""
    from trainlib import read_metrics, run_cli, tiny_recipe

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "2+2=\\ud800", "answer": "4"}\n'
                    '{"prompt": [{"role": "user", "content": "1+\\udfff1="}], "answer": "2\\ud83d"}\n' * 4)
    rows = load_prompts(str(data)).rows
    assert rows[0]["prompt"] == "2+2=\ufffd" and rows[1]["prompt"][0]["content"] == "1+\ufffd1="
    assert rows[1]["answer"] == "2\ufffd"
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", data__train=str(data), trainer__max_steps=1, trainer__eval_every=0,
                       rollout__batch_size=8, train__batch_size=8, train__micro_batch_size=8,
                       lint__waive={"batch-ratio-low": "a one-step run on a tiny file"})
    res = run_cli("train", path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and len(read_metrics(tmp_path / "run")) == 1
