"""Local verifiers environments shipped with rltune (rltune/envs/verifiers_env.py): they run
offline, through the same `verifiers:NAME` path as an installed environment.

    verifiers:rltune.envs.verifiers_examples.digits   single-turn: answer with a short number (2 criteria)
    verifiers:rltune.envs.verifiers_examples.guess    multi-turn: guess a number from 1 to 8, told higher/lower
    verifiers:rltune.envs.verifiers_examples.chat     the in-process chat harness rltune runs them with
"""
