"""`make check-docs` (bench/check_docs.py): every anchored number is regenerated and compared."""

from __future__ import annotations

import re

import pytest

from bench.check_docs import check_docs, collect, default_docs, evaluate, parse

TINY = "<!-- check-run tiny: sim experiments/tiny-3dc.yaml -->\n"


def test_an_anchor_reads_its_number_the_cell_and_the_texts_precision():
    runs, anchors = parse(TINY + "atlas takes **0.40<!-- check: tiny; scheduler=atlas; iteration_s -->** s\n", "d.md")
    assert runs == {"tiny": "sim experiments/tiny-3dc.yaml"}
    (a,) = anchors
    assert (a.where, a.text, a.run, a.file, a.filters, a.expr, a.fmt) == (
        "d.md:2", "0.40", "tiny", "summary.csv", (("scheduler", "atlas"),), "iteration_s", "%.2f")


@pytest.mark.parametrize("line, error", [
    ("1.5<!-- check: tiny; scheduler=atlas -->", "must read"),
    ("none<!-- check: tiny; scheduler=atlas; iteration_s -->", "no number right before"),
    ("1.5<!-- check: tiny; scheduler; iteration_s -->", "column=value"),
])
def test_a_malformed_anchor_names_its_line_and_the_fix(line, error):
    with pytest.raises(ValueError, match=f"d.md:1: .*{error}"):
        parse(line, "d.md")


def test_an_expression_is_arithmetic_over_columns_only():
    assert evaluate("100*gpu_util - 1", {"gpu_util": "0.5"}) == 49.0
    with pytest.raises(ValueError, match="only numbers"):
        evaluate("__import__('os')", {})
    with pytest.raises(ValueError, match="no column 'x'"):
        evaluate("x", {})


def test_every_anchor_in_the_docs_parses_and_names_a_defined_run():
    runs, anchors = collect(default_docs())
    assert {"paper", "bubbletea"} <= set(runs)
    assert len(anchors) >= 20


def test_a_doc_passes_when_its_numbers_match_the_run_and_fails_naming_the_one_that_differs(tmp_path):
    doc = tmp_path / "d.md"
    body = TINY + "| pp-wan | {pp}<!-- check: tiny; scheduler=pp-wan; iteration_s --> s |\n" \
                  "| atlas | {at}<!-- check: tiny; scheduler=atlas; 1e6*iteration_s; %.0f --> us |\n"
    doc.write_text(body.format(pp="0.0", at="0"))
    failures, n = check_docs([doc], log=lambda _: None)
    assert n == 2
    got = {m.group(1): m.group(2) for m in (re.search(r"d.md:(\d): .* gives ([\d.]+)", f) for f in failures)}
    assert set(got) == {"2", "3"}  # both wrong: the messages carry the true values
    doc.write_text(body.format(pp=got["2"], at=got["3"]))
    assert check_docs([doc], log=lambda _: None) == ([], 2)
    wrong = f"{float(got['3']) + 1:.0f}"
    doc.write_text(body.format(pp=got["2"], at=wrong))
    (failure,), _ = check_docs([doc], log=lambda _: None)
    assert failure.startswith(f"{doc}:3: the text says {wrong}, tiny/summary.csv gives {got['3']}"), failure


def test_a_run_whose_trace_is_missing_is_skipped_by_name_not_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("AZURE", str(tmp_path / "absent"))
    doc = tmp_path / "d.md"
    doc.write_text("<!-- check-run bt: sim experiments/bubbletea-3dc.yaml --set bubbletea.trace=$AZURE/x.csv -->\n"
                   "1.0<!-- check: bt; scheduler=atlas; iteration_s -->\n")
    said: list[str] = []
    assert check_docs([doc], log=said.append) == ([], 0)
    assert said == [f"skipped run 'bt' and its numbers: no Azure trace in {tmp_path / 'absent'} "
                    "(set AZURE to its folder)"]


def test_fix_rewrites_only_the_numbers_that_differ_as_the_text_wrote_them(tmp_path):
    doc = tmp_path / "d.md"
    body = TINY + "pp-wan {pp}<!-- check: tiny; scheduler=pp-wan; 1e6*iteration_s; %.0f --> us, " \
                  "atlas {at}<!-- check: tiny; scheduler=atlas; 1e6*iteration_s; %.0f --> us; kept\n"
    doc.write_text(body.format(pp="+9,999,999", at="0"))
    failures, n = check_docs([doc], log=lambda _: None, fix=True)
    assert n == 2 and len(failures) == 2
    fixed = doc.read_text()
    assert re.fullmatch(r"\+[\d,]+", fixed.split("pp-wan ")[1].split("<!--")[0])  # its '+' and its commas kept
    assert fixed.endswith("us; kept\n") and check_docs([doc], log=lambda _: None) == ([], 2)


def test_as_written_keeps_the_texts_sign_and_thousands():
    from bench.check_docs import as_written
    assert as_written("1185", "1,190") == "1,185"
    assert as_written("14", "+15") == "+14"
    assert as_written("-0.5", "+0.2") == "-0.5"
    assert as_written("2.84", "2.92") == "2.84"
