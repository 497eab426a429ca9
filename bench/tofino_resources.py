"""The Tofino compiler's resource report for the TNA program, as a table.

`make p4-tofino` compiles with `-g`, so bf-p4c writes, per chip, `pipe/logs/resources.json`
(what every MAU stage uses: stateful ALUs, SRAMs, TCAMs, logical tables, and by whom) and
`pipe/logs/phv.json` (the PHV containers it allocated). This reads both and writes the
summary docs/tofino.md commits, numbers only from the compiler's own files:

    python -m bench.tofino_resources build/tna > bench/results/tofino_resources.md
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

CHIPS = ("tofino", "tofino2")


@dataclass(frozen=True)
class Stage:
    number: int
    salus: int
    srams: int
    tcams: int
    logical_tables: int
    registers: tuple[str, ...]   # what the stage's stateful ALUs serve


@dataclass(frozen=True)
class ChipResources:
    chip: str
    stages_available: int
    stages: tuple[Stage, ...]
    salus_per_stage: int
    srams_per_stage: int
    tcams_per_stage: int
    phv_used: dict[int, int]     # container width -> containers occupied

    @property
    def stages_used(self) -> int:
        return len(self.stages)

    @property
    def fits(self) -> bool:
        # bf-p4c's back end alone reports success for a placement longer than the chip (the
        # assembler is what refuses it), so the report is checked here too.
        return self.stages_used <= self.stages_available


def _count(block: dict, key: str) -> int:
    return len(block.get(key, []))


def read_chip(out: Path, chip: str) -> ChipResources:
    logs = out / chip / "pipe" / "logs"
    resources = json.loads((logs / "resources.json").read_text())["resources"]
    mau = resources["mau"]
    stages = []
    per_stage = {"salus": 0, "srams": 0, "tcams": 0}
    for stage in mau["mau_stages"]:
        alus, rams, tcams = stage["meter_alus"], stage["rams"], stage["tcams"]
        per_stage = {"salus": alus["nAlus"], "srams": rams["nRows"] * rams["nColumns"],
                     "tcams": tcams["nRows"] * tcams["nColumns"]}
        users = sorted({u["used_by"] for m in alus["meters"] for u in m["usages"]})
        stages.append(Stage(stage["stage_number"], _count(alus, "meters"),
                            _count(rams, "srams"), _count(tcams, "tcams"),
                            _count(stage["logical_tables"], "ids"), tuple(users)))
    used = [s for s in stages if s.salus or s.srams or s.tcams or s.logical_tables]
    phv = json.loads((logs / "phv.json").read_text())
    occupied = Counter(c["bit_width"] for c in phv["containers"]
                       if c.get("container_type", "normal") == "normal")
    return ChipResources(chip, mau["nStages"], tuple(used), per_stage["salus"],
                         per_stage["srams"], per_stage["tcams"], dict(sorted(occupied.items())))


def summary(chips: list[ChipResources]) -> str:
    lines = ["| chip | MAU stages | stateful ALUs | SRAMs | TCAMs | PHV containers (8/16/32 bit) |",
             "|---|---|---|---|---|---|"]
    for c in chips:
        phv = "/".join(str(c.phv_used.get(w, 0)) for w in (8, 16, 32))
        over = "" if c.fits else " (does not fit)"
        lines.append(
            f"| {c.chip} | {c.stages_used} of {c.stages_available}{over} "
            f"| {sum(s.salus for s in c.stages)} of {c.salus_per_stage * c.stages_available} "
            f"| {sum(s.srams for s in c.stages)} of {c.srams_per_stage * c.stages_available} "
            f"| {sum(s.tcams for s in c.stages)} of {c.tcams_per_stage * c.stages_available} "
            f"| {phv} |")
    for c in chips:
        lines += ["", f"{c.chip}, stage by stage:", "",
                  "| stage | SALUs | SRAMs | TCAMs | logical tables | stateful ALUs serve |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {s.number} | {s.salus} | {s.srams} | {s.tcams} | {s.logical_tables} "
                  f"| {', '.join(r.split('.')[-1] for r in s.registers)} |" for s in c.stages]
    return "\n".join(lines) + "\n"


def compiled(chip_out: Path) -> bool:
    """The compiler's manifest says the compile succeeded, and its report is there (a
    failed compile leaves a partial resources.json behind)."""
    manifest = chip_out / "manifest.json"
    if not manifest.is_file() or not (chip_out / "pipe" / "logs" / "resources.json").is_file():
        return False
    return bool(json.loads(manifest.read_text()).get("compilation_succeeded"))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench.tofino_resources BUILD_DIR (make p4-tofino's TNA_OUT)",
              file=sys.stderr)
        return 2
    out = Path(argv[1])
    present = [c for c in CHIPS if compiled(out / c)]
    missing = [c for c in CHIPS if c not in present]
    if missing:
        print(f"no successful compile for {', '.join(missing)} under {out}: run make "
              "p4-tofino (it compiles with -g; a chip whose compile failed has no report "
              "worth reading, its compile.log says why)", file=sys.stderr)
    if not present:
        return 1
    chips = [read_chip(out, c) for c in present]
    sys.stdout.write(summary(chips))
    for c in chips:
        if not c.fits:
            print(f"{c.chip}: placed in {c.stages_used} stages of {c.stages_available}: it does "
                  "not fit the chip", file=sys.stderr)
    return 0 if all(c.fits for c in chips) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
