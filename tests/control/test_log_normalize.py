"""hybridctl/logs/normalize.py by itself: pasted log text -> whole entries, each at the line it starts on."""

from __future__ import annotations

import json

from hybridctl.logs.normalize import normalize


def entries(text: str) -> list[tuple[int, str]]:
    return [(e.number, e.message) for e in normalize(text.splitlines())]


def test_a_wrapped_traceback_from_an_issue_is_whole_again() -> None:
    pasted = """\
  File
"/opt/env/lib/python3.10/site-packages/sglang/srt/mem_cache/memory_pool.py",
line 499, in _init_mamba_pool
    self.mamba_pool = MambaPool(
torch.OutOfMemoryError: CUDA out of memory.
Tried to allocate 18.56 GiB."""
    assert entries(pasted) == [
        (1, '  File "/opt/env/lib/python3.10/site-packages/sglang/srt/mem_cache/memory_pool.py", line 499, '
            "in _init_mamba_pool"),
        (4, "    self.mamba_pool = MambaPool("),
        (5, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.56 GiB."),
    ]  # fmt: skip


def test_a_path_cut_mid_word_is_glued_without_a_space() -> None:
    (frame,) = entries('  File "/usr/lib/python3/dist-packages/sglang/srt/mem_ca\nche/memory_pool.py", line 1, in f')
    assert frame[1].endswith('File "/usr/lib/python3/dist-packages/sglang/srt/mem_cache/memory_pool.py", line 1, in f')


def test_an_exception_message_continued_over_lines_is_one_entry() -> None:
    text = (
        "ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible with\n"
        "radix cache when using --mamba-scheduler-strategy no_buffer. To use radix cache with speculative\n"
        "decoding, please use --mamba-scheduler-strategy extra_buffer."
    )
    ((number, message),) = entries(text)
    assert number == 1 and "compatible with radix cache when using --mamba-scheduler-strategy no_buffer." in message


def test_a_prefixed_message_takes_its_unprefixed_continuation_but_not_the_next_entry() -> None:
    text = (
        "[2026-01-01 00:00:00 TP0] Mamba radix extra-buffer is enabled with chunked_prefill_size=1024 smaller than\n"
        "mamba_cache_chunk_size=2048.\n"
        "[2026-01-01 00:00:01 TP0] Load weight end.\n"
        "python -m runtime: error: something else"
    )
    got = list(normalize(text.splitlines()))
    assert [(e.number, e.rank, e.prefixed) for e in got] == [(1, "TP0", True), (3, "TP0", True), (4, "", False)]
    assert got[0].message.endswith("smaller than mamba_cache_chunk_size=2048.")
    assert got[0].segments[-1] == "mamba_cache_chunk_size=2048."


def test_two_short_unprefixed_messages_stay_apart() -> None:
    assert [n for n, _ in entries("Load weight begin.\nLoad weight end.")] == [1, 2]


def test_the_source_line_under_a_frame_is_its_own_entry() -> None:
    text = '  File "/x/sglang/srt/a.py", line 3, in f\n    assert x >= y\nAssertionError'
    assert [m.strip() for _, m in entries(text)] == ['File "/x/sglang/srt/a.py", line 3, in f', "assert x >= y",
                                                      "AssertionError"]  # fmt: skip


def test_markdown_quoting_fences_html_and_elisions_are_removed_and_numbers_kept() -> None:
    text = "> ```\n> [2026-01-01 00:00:00] first\n> [...]\n<details>\n> ...\n> [2026-01-01 00:00:01] second\n```"
    assert entries(text) == [(2, "first"), (6, "second")]


def test_json_logging_gives_back_the_message_and_its_traceback() -> None:
    trace = 'Traceback (most recent call last):\n  File "/x/sglang/srt/a.py", line 3, in f\nKeyError: 1'
    record = {"time": "2026-01-01T00:00:00Z", "level": "ERROR", "rank": 3, "message": "Scheduler hit an exception"}
    record["exc_info"] = trace
    got = list(normalize([json.dumps(record)]))
    assert [e.message.strip() for e in got] == [
        "Scheduler hit an exception", "Traceback (most recent call last):", 'File "/x/sglang/srt/a.py", line 3, in f',
        "KeyError: 1",
    ]  # fmt: skip
    assert got[0].rank == "TP3" and got[0].prefixed and {e.number for e in got} == {1}
    docker = {"log": "[2026-01-01 00:00:00 TP1] Load weight end.\n", "stream": "stderr"}
    (e,) = normalize([json.dumps(docker)])
    assert (e.message, e.rank) == ("Load weight end.", "TP1")


def test_windows_and_wsl_paths_become_posix_paths() -> None:
    (win,) = entries(
        '  File "C:\\Users\\me\\venv\\Lib\\site-packages\\sglang\\srt\\mem_cache\\memory_pool.py", line 9, in g'
    )
    assert 'File "C:/Users/me/venv/Lib/site-packages/sglang/srt/mem_cache/memory_pool.py", line 9, in g' in win[1]
    (wsl,) = entries('  File "\\\\wsl.localhost\\Ubuntu\\home\\u\\sglang\\srt\\a.py", line 1, in f')
    assert "/wsl.localhost/Ubuntu/home/u/sglang/srt/a.py" in wsl[1]


def test_prefixes_colours_and_torch_rank_tags() -> None:
    got = list(normalize([
        "\x1b[31m[2026-01-01 00:00:00 DP1 TP3] boom\x1b[0m",
        "[rank2]: Traceback (most recent call last):",
        "sglang-1  | (SGLangHttpServer pid=7) ERROR 11-13 11:03:06 [core.py:708] done",
    ]))  # fmt: skip
    assert [(e.message, e.rank, e.prefixed) for e in got] == [
        ("boom", "DP1 TP3", True), ("Traceback (most recent call last):", "rank2", False), ("done", "", True),
    ]  # fmt: skip


def test_collector_stamps_ray_prefixes_carets_and_a_block_indented_as_a_whole() -> None:
    text = "\n".join([
        "    2026-03-02T11:21:07.123456789Z [2026-03-02 11:21:07 TP1] Scheduler hit an exception",
        "    2026-03-02T11:21:07.123456789Z Traceback (most recent call last):",
        '    (SGLangEngine pid=42, ip=10.0.0.7)   File "/x/sglang/srt/a.py", line 3, in f',
        "    (SGLangEngine pid=42, ip=10.0.0.7)     x = g()",
        "    (SGLangEngine pid=42, ip=10.0.0.7)         ^^^",
        "    Mar 02 11:21:07 gpu-node python3[991]: KeyError: 1",
    ])  # fmt: skip
    got = list(normalize(text.splitlines()))
    assert [(e.message.strip(), e.rank, e.prefixed) for e in got] == [
        ("Scheduler hit an exception", "TP1", True), ("Traceback (most recent call last):", "", False),
        ('File "/x/sglang/srt/a.py", line 3, in f', "", False), ("x = g()", "", False), ("KeyError: 1", "", False),
    ]  # fmt: skip


def test_loguru_prefixes_frames_without_the_word_file_and_other_json_keys() -> None:
    assert entries("2026-03-02 11:21:07.512 | ERROR    | sglang.srt:run:10 - Scheduler died") == [(1, "Scheduler died")]
    (frame,) = entries('"/x/sglang/srt/mem_cache/memory_pool.py", line 499, in _init_mamba_pool')
    assert frame[1].strip() == 'File "/x/sglang/srt/mem_cache/memory_pool.py", line 499, in _init_mamba_pool'
    record = {"level": "error", "msg": "boom", "exc": "Traceback (most recent call last):\nKeyError: 1"}
    assert [m for _, m in entries(json.dumps(record))] == ["boom", "Traceback (most recent call last):", "KeyError: 1"]


def test_html_entities_of_a_copied_page_are_undone() -> None:
    (frame,) = entries("&gt;   File &quot;/x/sglang/srt/a.py&quot;, line 3, in f")
    assert frame[1].strip() == 'File "/x/sglang/srt/a.py", line 3, in f'
