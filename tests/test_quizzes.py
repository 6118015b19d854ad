"""The lecture quizzes (docs/quizzes/): one per lecture, about five questions each; their numeric answers in the
instructor-only docs/quizzes/answers.md are recomputed here from the course's reference code (or NumPy where the
answer is arithmetic), to the digits the answer file gives, so that a change of the code or of the file shows."""
import contextlib
import io
import math
import re
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
QUIZ = REPO / "docs" / "quizzes"
ANSWER = re.compile(r"\[(\d\d[a-z]?\.\d+[a-z]?)\] = (-?\d+(?:\.\d+)?)")


def _computed() -> dict:
    """Every numeric answer, computed."""
    from reference.distributed.layout import rank_segments
    from reference.numpy.attention import causal_mask
    from reference.numpy.merge import merge_states
    from reference.numpy.softmax import merge_softmax_stats, softmax_stats
    from reference.simulators import cycle_model, fragmentation, iosim, scheduling

    a = {}
    a["00.2"] = 32 // 8
    a["00.3"] = int(causal_mask(3, 5).sum())
    a["00.4"] = 16384 ** 2 * np.dtype(np.float32).itemsize / 2 ** 20
    with np.errstate(over="ignore"):
        a["01.1"] = next(x for x in range(64) if np.isinf(np.exp(np.float16(x))))
    (m1, l1), (m2, l2) = softmax_stats(np.array([1.0, 2.0])), softmax_stats(np.array([3.0]))
    a["01.4"] = merge_softmax_stats(m1, l1, m2, l2)[1]
    m, l = softmax_stats(np.zeros(4))
    a["01.5"] = m + math.log(l)
    with contextlib.redirect_stdout(io.StringIO()):
        t = iosim.seeds_table()
    a["02.1"], a["02.2"] = t["standard"]["hbm_gb"], t["flash"]["hbm_gb"]
    a["02.2r"] = t["standard"]["hbm_gb"] / t["flash"]["hbm_gb"]
    gpu = t["config"]["gpu_model"]
    a["02.3"] = gpu["matmul_flops"] / gpu["hbm_bandwidth"]
    io_m = [iosim.flash_attention_io(1, 1, 16384, 64, sram_bytes=s).hbm_bytes for s in (64 << 10, 128 << 10)]
    a["02.4"] = round(io_m[1] / io_m[0], 1)
    visits = scheduling.tile_visits(1024, 1024, 128, 128, causal=True)
    a["03.1"] = int((visits > 0).sum())
    mask = causal_mask(1024, 1024).reshape(8, 128, 8, 128).transpose(0, 2, 1, 3).reshape(8, 8, -1)
    a["03.3"] = int((mask.any(-1) & ~mask.all(-1)).sum())
    a["03.4"] = 4 * 4096 ** 2 * 128 / 1e9
    a["04.1"] = float(np.sum(np.array([1.0, 2.0]) * np.array([3.0, -1.0])))
    a["04.2"] = 8192 ** 2 * np.dtype(np.float16).itemsize / 2 ** 20
    a["04.3"] = 8192 * np.dtype(np.float32).itemsize / 2 ** 10
    a["05.1"] = math.ceil(4096 / 128) * 4 * 16
    a["05.3"] = (128 * 128 + 2 * 64 * 128) * np.dtype(np.float16).itemsize / 2 ** 10
    tc = cycle_model.tile_cycles(head_dim=128, block_m=128, block_n=128, gpu="H100", dtype="fp16")
    a["05a.1"] = math.ceil(1000 / 256)
    a["05a.2"] = a["05a.1"] * 256 - 1000
    a["05a.4"] = 3 * (128 * 64 + 64 * 128) * np.dtype(np.float16).itemsize / 2 ** 10
    a["05b.2"] = 2 * 4096 * 4096 * np.dtype(np.float16).itemsize / 1e6
    a["05b.3"] = a["05b.2"] * 1e6 / 4.0e12 * 1e6
    a["05b.4"] = 800e12 / 4e12
    a["06.1"] = tc["exp_cycles"] / tc["mma_cycles"]
    a["06.2a"] = cycle_model.pingpong_utilisation(tc["mma_cycles"], tc["exp_cycles"], overlap=False)
    a["06.2b"] = cycle_model.pingpong_utilisation(tc["mma_cycles"], tc["exp_cycles"])
    from reference.simulators.mbarrier import MBarrier
    a["06.3"] = next(p for p in (0, 1) if MBarrier("fresh", 1).passes(p))
    a["07.1"] = fragmentation.KV_BYTES_PER_TOKEN_13B
    a["07.2"] = 32 / 132
    o_a, o_b = np.zeros((1, 1)), np.ones((1, 1))           # the merged output is the weight of split b's 1 ...
    o, _ = merge_states(o_a, np.array([math.log(2)]), o_b, np.array([math.log(6)]))
    a["07.4"] = 1 - float(o[0, 0])                          # ... so split a's weight is 1 minus it
    a["08.1"] = math.ceil(1000 / 16)
    a["08.2"] = a["08.1"] * 16 - 1000
    a["08.3"] = 100 * 500 / 2048
    a["09.1"] = int(np.cumsum([0, 3, 5, 2])[-1])
    a["09.2"] = (3 * 5 - 10) / (3 * 5)

    def load(layout, world, n):               # chunk pairs (query chunk, key chunk <= it) per device
        return [sum(q_hi - q_lo for q_lo, q_hi in segs) and sum(q + 1 for lo, hi in segs for q in range(lo, hi))
                for segs in rank_segments(n, world, layout)]
    naive, zigzag = load("contiguous", 4, 4), load("zigzag", 4, 8)
    a["10.1"] = max(naive) / np.mean(naive)
    a["10.2"] = max(zigzag) / np.mean(zigzag)
    a["10.3"] = 2 * (131072 // 8) * 8 * 128 * 2 / 2 ** 20
    return a


def _answers() -> dict:
    return {k: v for k, v in ANSWER.findall((QUIZ / "answers.md").read_text())}


def test_every_numeric_answer_matches_the_code():
    computed, written = _computed(), _answers()
    assert set(written) == set(computed), (set(written) ^ set(computed))
    bad = []
    for key, text in written.items():
        digits = len(text.split(".")[1]) if "." in text else 0
        if round(float(computed[key]), digits) != float(text):
            bad.append(f"[{key}] written {text}, computed {computed[key]!r}")
    assert bad == []


def test_a_wrong_answer_would_be_caught():
    """Positive control: the comparison rounds to the written digits, so an off-by-a-digit answer fails."""
    c = _computed()
    assert round(c["01.4"], 4) != 1.5033 and round(c["02.1"], 2) != 40.3


def test_one_quiz_per_lecture_with_about_five_questions():
    lectures = sorted(p.stem for p in (REPO / "lectures" / "src").glob("[0-9][0-9]*_*.py"))
    quizzes = {p.stem: p.read_text() for p in QUIZ.glob("[0-9][0-9]*_*.md")}
    assert [lec for lec in lectures if lec not in quizzes] == []
    for stem, text in quizzes.items():
        n = len(re.findall(r"^\d+\. ", text, re.M))
        assert 4 <= n <= 7, (stem, n)
        assert text.startswith("# Quiz: lecture"), stem
        assert not ANSWER.search(text), f"{stem}: an answer in the questions"
    answers = (QUIZ / "answers.md").read_text()
    for stem in quizzes:
        assert f"## {stem.split('_')[0]} " in answers, stem


def test_the_release_ships_questions_not_answers(tmp_path):
    from assignments.release import build
    out = tmp_path / "rel"
    build(out)
    shipped = {p.name for p in (out / "quizzes").glob("*.md")}
    assert shipped == {p.name for p in QUIZ.glob("[0-9][0-9]*_*.md")}
    every = "".join(p.read_text(errors="ignore") for p in out.rglob("*") if p.suffix in (".md", ".ipynb", ".py"))
    assert "[01.4] = " not in every and "Quiz answers (instructor-only)" not in every
