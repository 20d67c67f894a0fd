"""A chat template's render, bounded: `within` (targets/deadline.py) stops a call on the main thread and
on others and leaves other SIGALRM users alone; `ChatFormat` names the template's file and tokenises its
text exactly as `apply_chat_template(tokenize=True)` (and vLLM) do.

    .venv/bin/python -m pytest tests/targets/test_template_bounds.py -q
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from dspark_cli.errors import UsageError
from dspark_cli.targets.chat import ChatFormat, RenderBounds, template_origin
from dspark_cli.targets.deadline import Overtime, within


def spin() -> None:
    while True:
        pass


def test_within_returns_and_leaves_no_alarm_behind():
    assert within(5.0, lambda: 42) == 42
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_within_stops_a_busy_call_on_the_main_thread():
    started = time.perf_counter()
    with pytest.raises(Overtime):
        within(0.2, spin)
    assert time.perf_counter() - started < 1.5
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_within_stops_a_busy_call_on_another_thread():
    caught: list[BaseException] = []

    def render() -> None:
        try:
            within(0.2, spin)
        except Overtime as exc:
            caught.append(exc)

    worker = threading.Thread(target=render)
    started = time.perf_counter()
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and len(caught) == 1
    assert time.perf_counter() - started < 3


def test_someone_elses_alarm_is_left_alone():
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        with pytest.raises(Overtime):
            within(0.2, spin)  # by the timer thread: the handler is not ours to replace
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        time.sleep(0.3)
        assert fired == [1]
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_an_alarm_outside_a_render_does_what_sigalrm_does():
    code = (
        "import signal, time; from dspark_cli.targets.deadline import within; within(5.0, lambda: None); "
        "signal.setitimer(signal.ITIMER_REAL, 0.1); time.sleep(5)"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=30, capture_output=True)
    assert done.returncode == -signal.SIGALRM, done.stderr


def _target_copy(tmp_path, *, in_config: bool):
    from dspark_cli.targets import resolve_target

    target = tmp_path / "t"
    shutil.copytree(resolve_target("tiny-gqa"), target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    if in_config:
        config["chat_template"] = (target / "chat_template.jinja").read_text()
        (target / "chat_template.jinja").unlink()
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("in_config", [False, True])
def test_the_template_is_named_by_its_file(tmp_path, in_config):
    from transformers import AutoTokenizer

    target = _target_copy(tmp_path, in_config=in_config)
    expected = f"{target}/tokenizer_config.json (chat_template)" if in_config else f"{target}/chat_template.jinja"
    assert template_origin(AutoTokenizer.from_pretrained(str(target))) == expected

    class HubTokenizer:
        name_or_path = "org/model"

    assert template_origin(HubTokenizer()) == "of org/model"


@pytest.mark.parametrize("name", ["tiny-mla", "tiny-gqa"])
def test_ids_are_those_of_apply_chat_template(name):
    from transformers import AutoTokenizer

    from dspark_cli.targets import resolve_target

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_target(name)))
    chat = ChatFormat(tokenizer, {})
    messages = [
        {"role": "system", "content": "brief <|user|> mention"},
        {"role": "user", "content": "héllo\n  wörld <|end|>"},
        {"role": "assistant", "content": "an answer " * 7},
    ]
    for upto in (2, 3):
        for prompt in (True, False):
            out = tokenizer.apply_chat_template(messages[:upto], tokenize=True, add_generation_prompt=prompt)
            expected = list(out["input_ids"] if hasattr(out, "keys") else out)
            assert chat.render_ids(messages[:upto], prompt) == expected


def test_output_bound_counts_the_conversation():
    from transformers import AutoTokenizer

    from dspark_cli.targets import resolve_target

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_target("tiny-mla")))
    long_message = [{"role": "user", "content": "word " * 100_000}]  # 500 kB of its own: not the template's
    chat = ChatFormat(tokenizer, {}, bounds=RenderBounds(seconds=5.0, extra_chars=100))
    assert len(chat.render_text(long_message, True)) > 500_000
    with pytest.raises(UsageError, match="printed"):
        ChatFormat(tokenizer, {}, bounds=RenderBounds(seconds=5.0, extra_chars=0)).render_text(
            [{"role": "user", "content": "x"}], True
        )
