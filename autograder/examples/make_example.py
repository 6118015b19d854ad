"""Regenerate ``a1_attention_example.ipynb``: a filled-in a1 student notebook with ONE deliberately wrong
function (attention's causal mask is aligned top-left), so ``make grade`` shows a mix of passes and failures.

    python autograder/examples/make_example.py
"""
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "submissions" / "a1_attention" / "wrong" / "w_top_left_causal.mutant.json"


def main():
    from autograder.selftest import materialise_mutant
    code = materialise_mutant(SRC).read_text().split('"""', 2)[2].strip()
    imports, rest = code.split("\n\n\n", 1)
    funcs = rest.split("\n\n\n")
    nb = nbformat.v4.new_notebook()
    cells = [
        nbformat.v4.new_markdown_cell("# Assignment 1 (example submission)\n\nA filled-in notebook used by "
                                      "`make grade`: every function is implemented, but `attention` aligns the "
                                      "causal mask top-left, so the causal `Nq != Nk` test fails."),
        nbformat.v4.new_code_cell("%matplotlib inline\n" + imports),
    ]
    for f in funcs:
        cells.append(nbformat.v4.new_code_cell(f))
        name = f.split("(", 1)[0].replace("def ", "")
        if not name.startswith("_"):
            c = nbformat.v4.new_code_cell(f"from autograder.check import check\ncheck(\"a1.{name}\", {name})")
            c.metadata["tags"] = ["check"]
            cells.append(c)
    cells.append(nbformat.v4.new_code_cell("!echo shell lines are skipped by the grader\nprint('done')"))
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, HERE / "a1_attention_example.ipynb")


if __name__ == "__main__":
    main()
