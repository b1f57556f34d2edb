"""Run the real-model recipe (recipes/smollm2_arithmetic.yaml: SmolLM2-135M-Instruct on reasoning-gym's chain_sum)
for several seeds and measure what it learns on the test split, which no setting was chosen on.

For each seed, in its own folder under ``--out``: ``lightning-grpo test`` of the untrained model (before), the
recipe's ``fit`` (its wall time), ``lightning-grpo test`` of the run's last checkpoint (after), then the run exported
(``lightning-grpo export``), served (``lightning-grpo serve``) and the test split asked over HTTP as chat messages
(greedy): the served export must score what ``test`` measured. The table gives test accuracy before -> after,
greedy and mean@8, with both answer extractions (strict: "Answer: N"; lenient: the last number), the served
export's greedy strict figure, and the guards that fired during the fit.

    python benchmarks/smollm2_seeds.py --seeds 0 1 2 --write
    python benchmarks/smollm2_seeds.py --seeds 0 1 2 --collect --write   # the table of runs already in --out
    python benchmarks/smollm2_seeds.py --seeds 0 --served                # export, serve and score runs in --out
    python benchmarks/smollm2_seeds.py --served-model DIR                # serve a model folder and score it
    python benchmarks/smollm2_seeds.py --recipe recipes/smollm2_arithmetic_lora.yaml --seeds 0 --write

``--write`` puts the table into docs/evidence/learning.md between the ``<!-- <recipe>-results -->``
markers, under the machine line. Run it alone on the machine: the wall times are those of 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

from quickstart_seeds import FIXED_ORDER, ROOT, machine_line, threads_note, write_learning_table

RECIPE = ROOT / "recipes" / "smollm2_arithmetic.yaml"
#: (column heading, metric) of the table, each shown before -> after.
FIGURES = (
    ("greedy strict", "test/greedy/strict"),
    ("greedy lenient", "test/greedy/lenient"),
    ("mean@8 strict", "test/mean@8/strict"),
    ("mean@8 lenient", "test/mean@8/lenient"),
)


def _lightning_grpo(args: list[str], log: Path, cwd: Path) -> None:
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "lightning_grpo", *args], cwd=cwd, stdout=out, stderr=out)
    if done.returncode != 0:
        raise SystemExit(f"lightning-grpo {args[0]} failed (exit {done.returncode}); see {log}")


def run_seed(recipe: Path, seed: int, folder: Path) -> None:
    """Test before, fit, test after; the fit's wall seconds in ``fit_seconds.txt``."""
    folder.mkdir(parents=True, exist_ok=True)
    common = ["-c", str(recipe), "--seed_everything", str(seed), "--trainer.enable_progress_bar", "false"]
    _lightning_grpo(["test", *common, "--trainer.logger.init_args.name", "before"], folder / "before.log", folder)
    start = time.monotonic()
    _lightning_grpo(["fit", *common, *FIXED_ORDER], folder / "fit.log", folder)
    (folder / "fit_seconds.txt").write_text(f"{time.monotonic() - start:.0f}\n")
    checkpoint = f"runs/{recipe.stem}/version_0/checkpoints/last.ckpt"
    after = ["test", *common, "--trainer.logger.init_args.name", "after", "--ckpt_path", checkpoint]
    _lightning_grpo(after, folder / "after.log", folder)
    served(recipe, folder)


def served(recipe: Path, folder: Path) -> None:
    """Export the seed's run, serve the export with ``lightning-grpo serve`` and score the test split over HTTP
    (chat completions: the exported chat template renders the system prompt and question; greedy, 96 new tokens,
    the strict and lenient readings); the figures go to ``served.json``."""
    _lightning_grpo(["export", f"runs/{recipe.stem}", "--out", "model"], folder / "export.log", folder)
    (folder / "served.json").write_text(json.dumps(served_figures(recipe, folder / "model", folder)))


def served_figures(recipe: Path, model: Path, folder: Path) -> dict[str, float]:
    """The test split's greedy accuracy (strict, lenient) of ``lightning-grpo serve MODEL``, asked over HTTP."""
    from lightning_grpo.cli.app import build_cli
    from lightning_grpo.data.rewards import final_number

    dm = build_cli(args=["-c", str(recipe)], run=False).datamodule
    dm.setup("test")
    records = dm.test_records
    texts = _served_answers(model, folder, [r["raw_prompt"] for r in records])
    answers = [r["answer"] for r in records]
    return {
        f"served/greedy/{kind}": sum(final_number(texts, answer=answers, extraction=kind)) / len(records)
        for kind in ("strict", "lenient")
    }


def _served_answers(model: Path, folder: Path, chats: list[list[dict]]) -> list[str]:
    """Greedy replies of ``lightning-grpo serve MODEL`` (its log in ``folder``) to ``chats``, 8 requests at a time."""
    import socket
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    def ask(messages: list[dict]) -> str:
        name = json.load(urllib.request.urlopen(url + "/v1/models", timeout=60))["data"][0]["id"]
        body = {"model": name, "messages": messages, "max_tokens": 96, "temperature": 0}
        request = urllib.request.Request(
            url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        return json.load(urllib.request.urlopen(request, timeout=600))["choices"][0]["message"]["content"]

    command = [sys.executable, "-m", "lightning_grpo", "serve", str(model), "--port", str(port)]
    with open(folder / "serve.log", "w") as log:
        server = subprocess.Popen(command, cwd=folder, stdout=log, stderr=log)
        try:
            _wait_healthy(url, server)
            with ThreadPoolExecutor(8) as pool:
                return list(pool.map(ask, chats))
        finally:
            server.terminate()
            server.wait(60)


def _wait_healthy(url: str, server: subprocess.Popen, seconds: int = 600) -> None:
    import urllib.request

    for _ in range(seconds):
        if server.poll() is not None:
            raise SystemExit(f"lightning-grpo serve exited ({server.returncode}); see serve.log")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"no healthy server at {url} after {seconds} s; see serve.log")


def _last_row(path: Path) -> dict[str, float]:
    rows = list(csv.DictReader(path.open()))
    return {k: float(v) for k, v in rows[-1].items() if v}


def collect(recipe: Path, seed: int, folder: Path) -> dict:
    """The seed's test figures before and after, fit seconds and the alarms that fired."""
    runs = folder / "runs"
    fit_rows = list(csv.DictReader((runs / recipe.stem / "version_0/metrics.csv").open()))
    alarms = sorted(
        {
            k.removeprefix("alarm/")
            for r in fit_rows
            for k, v in r.items()
            if k.startswith("alarm/") and v and float(v) > 0
        }
    )
    seconds = folder / "fit_seconds.txt"
    served_figures = folder / "served.json"
    return {
        "served": json.loads(served_figures.read_text()) if served_figures.is_file() else None,
        "seed": seed,
        "before": _last_row(runs / "before/version_0/metrics.csv"),
        "after": _last_row(runs / "after/version_0/metrics.csv"),
        "minutes": float(seconds.read_text()) / 60 if seconds.is_file() else None,
        "alarms": alarms,
    }


def table(results: list[dict]) -> str:
    head = "| seed | " + " | ".join(name for name, _ in FIGURES)
    head += " | strict gain (greedy) | served export, greedy strict | fit minutes | alarms |"
    lines = [head, "|" + "---|" * (len(FIGURES) + 5)]
    for r in results:
        cells = [f"{r['before'][key]:.3f} -> {r['after'][key]:.3f}" for _, key in FIGURES]
        gain = r["after"]["test/greedy/strict"] - r["before"]["test/greedy/strict"]
        minutes = f"{r['minutes']:.1f}" if r["minutes"] is not None else "n/a"
        served = f"{r['served']['served/greedy/strict']:.3f}" if r["served"] else "not run"
        lines.append(
            f"| {r['seed']} | "
            + " | ".join(cells)
            + f" | **{gain:+.3f}** | {served} | {minutes} | {', '.join(r['alarms']) or 'none'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--recipe", type=Path, default=RECIPE, help="the recipe (its LoRA variant: smollm2_arithmetic_lora)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("/tmp/smollm2_seeds"))
    parser.add_argument("--collect", action="store_true", help="read the runs already in --out, run nothing")
    parser.add_argument("--served", action="store_true", help="export, serve and score the runs already in --out")
    parser.add_argument("--served-model", type=Path, help="serve this model folder, score it on the test split, exit")
    parser.add_argument("--write", action="store_true", help="write the table into docs/evidence/learning.md")
    args = parser.parse_args()
    args.recipe = args.recipe.resolve()  # the runs start in their own folders
    if args.served_model:
        print(json.dumps(served_figures(args.recipe, args.served_model.resolve(), args.out)))
        return
    for seed in [] if args.collect or args.served else args.seeds:
        run_seed(args.recipe, seed, args.out / f"seed{seed}")
    for seed in args.seeds if args.served else []:
        served(args.recipe, args.out / f"seed{seed}")
    text = table([collect(args.recipe, seed, args.out / f"seed{seed}") for seed in args.seeds])
    print(text)
    if args.write:
        marker = f"<!-- {args.recipe.stem}-results -->"
        write_learning_table(ROOT / "docs/evidence/learning.md", marker, text, machine_line(threads_note(1)))


if __name__ == "__main__":
    main()
