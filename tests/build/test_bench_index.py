"""bench/results holds the records the docs cite, each listed in its index
(bench/results/README.md). Pure text: no build, no jax."""

import re

INDEX_ROW = re.compile(r"^\| \[([^\]]+)\]\(([^)]+)\) \|", re.MULTILINE)
CITATION = re.compile(r"bench/results/([A-Za-z0-9_.\-]+\.[A-Za-z0-9]+)")


def _indexed(results):
    rows = INDEX_ROW.findall((results / "README.md").read_text())
    for label, target in rows:
        assert label == target, f"bench/results/README.md: the row for {label} links to {target}"
    return [label for label, _ in rows]


def _doc_pages(repo_root):
    return [repo_root / "README.md", *sorted((repo_root / "docs").glob("**/*.md"))]


def test_every_result_is_in_the_index_and_every_row_names_a_file(repo_root):
    results = repo_root / "bench" / "results"
    files = {p.name for p in results.iterdir() if p.is_file() and p.name != "README.md"}
    listed = _indexed(results)
    repeated = sorted({name for name in listed if listed.count(name) > 1})
    assert not repeated, f"bench/results/README.md lists these files more than once: {repeated}"
    unlisted = sorted(files - set(listed))
    assert not unlisted, f"add a row to bench/results/README.md for each of: {unlisted}"
    missing = sorted(set(listed) - files)
    assert not missing, f"bench/results/README.md lists files that are not in bench/results: {missing}"


def test_every_cited_result_exists(repo_root):
    results = repo_root / "bench" / "results"
    broken = []
    for page in _doc_pages(repo_root):
        for name in CITATION.findall(page.read_text()):
            if not (results / name).is_file():
                broken.append(f"{page.relative_to(repo_root)}: bench/results/{name}")
    assert not broken, "cited results that do not exist:\n" + "\n".join(broken)


def test_every_result_is_cited_by_the_docs(repo_root):
    results = repo_root / "bench" / "results"
    cited = set()
    for page in _doc_pages(repo_root):
        cited.update(CITATION.findall(page.read_text()))
    uncited = sorted(p.name for p in results.iterdir() if p.name != "README.md" and p.name not in cited)
    assert not uncited, f"results no page of the docs cites (cite them or remove them): {uncited}"
