"""`conformance merge OUT DIR...`: one results document from the parts of one run. Pure; no I/O.

The parts are the report dirs of a CI matrix (`--shard I/N`, each recording `I/N`, the cases it
owned and a digest of the cases the whole run chose from) or of runs on several machines. The
merge checks that the parts belong together (one implementation, one golden store, one
selection), that every shard is there exactly once and that no case was judged twice, then judges
the components again on the union: a full run's case floors, which no single shard can check,
are enforced here. Whatever does not add up becomes a problem of the merged run (exit 1), and
the cases that are there keep their verdicts.
"""

from __future__ import annotations

from .session import NOT_RUN, exit_code_of, judge_components, run_level_names


def merge_results(parts: list[tuple[str, dict]], floors: dict[str, int]) -> dict:
    """`parts`: (where it came from, its results document), in the order given."""
    problems: list[str] = []
    first = parts[0][1]
    _same(parts, "impl", problems)
    _same(
        parts,
        "goldens",
        problems,
        what="golden store (its MANIFEST.json's SHA-256)",
        value=lambda d: (d.get("goldens") or {}).get("manifest_sha256"),
    )
    complete = _check_shards(parts, problems)
    cases: dict[str, dict] = {}
    where: dict[str, str] = {}
    for label, doc in parts:
        owned = (doc.get("selection") or {}).get("owned")
        if owned is not None and owned != len(doc["cases"]):
            problems.append(
                f"{label}: owned {owned} case(s) but its results hold {len(doc['cases'])}; "
                "the report is incomplete (re-run that shard)"
            )
        for case in doc["cases"]:
            if case["id"] in cases:
                problems.append(f"case {case['id']} is in {where[case['id']]} and in {label}; kept the first")
                continue
            cases[case["id"]] = case
            where[case["id"]] = label
    total = (first.get("selection") or {}).get("total")
    if complete and total is not None and len(cases) != total and not problems:
        problems.append(f"the parts hold {len(cases)} case(s), the run chose {total}")
    results = [cases[i] for i in sorted(cases)]
    stopped = "; ".join(f"{label}: {doc['stopped']}" for label, doc in parts if doc.get("stopped"))
    signals = [doc["exit_code"] - 128 for _, doc in parts if doc.get("exit_code", 0) > 128]
    full_run = complete and all(not doc.get("select") and doc.get("tier", "small") == "small" for _, doc in parts)
    recorded = {
        name: entry["floor"] for _, doc in parts for name, entry in doc["components"].items() if "floor" in entry
    }
    run_diagnosis = run_level_names(results)  # over every part's cases, as one run would
    components, judged = judge_components(results, {**floors, **recorded}, full_run, stopped)
    problems += judged
    stale = set.intersection(*(set(doc.get("stale_expectations", [])) for _, doc in parts))
    devices = sorted({str(doc.get("device")) for _, doc in parts})
    return {
        **{k: v for k, v in first.items() if k not in ("baseline", "cases", "components", "problems")},
        "device": ", ".join(devices),
        "shard": None,
        "started": min(str(doc.get("started", "")) for _, doc in parts),
        "duration_s": max(float(doc.get("duration_s", 0)) for _, doc in parts),
        "exit_code": exit_code_of(results, problems, stopped, signals[0] if signals else None),
        "components": components,
        "problems": problems,
        "run_diagnosis": run_diagnosis,
        "stopped": stopped,
        "not_run": sum(1 for r in results if r["status"] == NOT_RUN),
        "stale_expectations": sorted(stale),
        "merged_from": [
            {
                "from": label,
                "shard": doc.get("shard"),
                "cases": len(doc["cases"]),
                "device": doc.get("device"),
                "exit_code": doc.get("exit_code"),
                "started": doc.get("started"),
                "duration_s": doc.get("duration_s"),
            }
            for label, doc in parts
        ],
        "floors_enforced": full_run,
        "cases": results,
    }


def _same(parts, key: str, problems: list[str], what: str | None = None, value=None) -> None:
    value = value or (lambda d: d.get(key))
    seen: dict[object, list[str]] = {}
    for label, doc in parts:
        seen.setdefault(value(doc), []).append(label)
    if len(seen) > 1:
        listed = "; ".join(f"{v!s:.16} in {', '.join(labels)}" for v, labels in seen.items())
        problems.append(f"the parts differ in {what or key}: {listed}; merge the parts of one run only")


def _check_shards(parts, problems: list[str]) -> bool:
    """True when the parts are a complete set: N shards of one N, each once; or unsharded runs."""
    sharded = [(label, doc["shard"]) for label, doc in parts if doc.get("shard")]
    if not sharded:
        return len(parts) == 1  # runs split by --select: the union is judged, its floors are not
    if len(sharded) != len(parts):
        unsharded = [label for label, doc in parts if not doc.get("shard")]
        problems.append(f"{', '.join(unsharded)} ran unsharded beside shards; merge the shards of one run")
        return False
    counts = {n for _, (_, n) in sharded}
    if len(counts) > 1:
        problems.append(
            f"the shards were cut different ways ({', '.join(f'{label}: {i}/{n}' for label, (i, n) in sharded)})"
        )
        return False
    count = counts.pop()
    _same(
        parts,
        "selection",
        problems,
        what="selection of cases (--select, the case files)",
        value=lambda d: (d.get("selection") or {}).get("ids_sha256"),
    )
    owners: dict[int, list[str]] = {}
    for label, (index, _) in sharded:
        owners.setdefault(index, []).append(label)
    for index, labels in sorted(owners.items()):
        if len(labels) > 1:
            problems.append(f"shard {index}/{count} is given twice ({', '.join(labels)}); kept the first")
    missing = [i for i in range(1, count + 1) if i not in owners]
    for index in missing:
        problems.append(
            f"shard {index}/{count} is missing: no report among the parts ran it, so its cases "
            "were never judged; add its report dir"
        )
    return not missing
