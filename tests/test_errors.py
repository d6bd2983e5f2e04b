"""mlrc.errors: the one-line message helpers and the process check every module shares."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlrc.errors import alive, first_line, worker_message


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ValueError("boom"), "boom"),
        (ValueError("\n  first line  \nsecond line"), "first line"),
        (ValueError(""), "ValueError"),
        (ValueError(" \n "), "ValueError"),
        ("a message\nmore", "a message"),
        ("", ""),
    ],
)
def test_first_line_is_the_first_non_blank_line(error, expected):
    assert first_line(error) == expected


def test_first_line_default_replaces_an_empty_message():
    assert first_line(KeyError(), default="") == ""
    assert first_line(RuntimeError("\n"), "(no message)") == "(no message)"
    assert first_line(RuntimeError("kept"), "(no message)") == "kept"


def test_worker_message_keeps_the_original_error_of_a_dataloader_worker():
    wrapped = (
        "Caught DatasetError in DataLoader worker process 0.\nOriginal Traceback (most recent "
        'call last):\n  File "x.py", line 1, in f\n    raise DatasetError(...)\n'
        "DatasetError: /data/a.jpg: unreadable image\n"
    )
    assert worker_message(wrapped) == "/data/a.jpg: unreadable image"
    other = "Original Traceback (most recent call last):\nKeyError: 'x'\n"
    assert worker_message(other) == "KeyError: 'x'"
    assert worker_message("plain\nmessage") == "plain\nmessage"


def test_alive_tells_running_from_finished_processes():
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not alive(child.pid)
