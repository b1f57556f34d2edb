#!/usr/bin/env bash
# The package as pip users get it: build the sdist and the wheel, `twine check` them, check that the
# wheel holds every file of lightning_grpo/ and the LICENSE, run the README's install lines as written
# (build the wheel, install it with the cpu extra into a fresh venv) in a copy of the checkout, and
# train 2 quickstart steps with it from outside the checkout.
# Fails unless lightning_grpo is imported from that venv and 2 training steps are logged.
#
#   bash scripts/check_wheel.sh     # after scripts/install.sh --dev (CI: a step of .ci/run)
#
# TOOLS_VENV (default .venv, where the dev extra puts build and twine) runs build and twine;
# PYTHON (default python3) makes the fresh venv. Everything it makes lies in a temporary folder,
# removed at exit. See scripts/_cpu_venv.sh for the CPU torch index (PIP_EXTRA_INDEX_URL).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
TOOLS_VENV=${TOOLS_VENV:-.venv}
unset PYTHONPATH  # the import check below must not find the checkout by any other way
source scripts/_cpu_venv.sh

work=$(mktemp -d)
egg_info_before=$([[ -e lightning_grpo.egg-info ]] && echo yes || echo no)
cleanup() {
  rm -rf "$work"
  # building the sdist writes lightning_grpo.egg-info into the checkout: remove it unless it was there
  if [[ $egg_info_before == no ]]; then rm -rf "$root/lightning_grpo.egg-info"; fi
}
trap cleanup EXIT

echo "== build: sdist, then the wheel from the sdist"
"$TOOLS_VENV/bin/python" -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; exit 1; }
grep -E "^Successfully built" "$work/build.log"
"$TOOLS_VENV/bin/python" -m twine check --strict "$work"/dist/*

echo "== contents: every tracked file of lightning_grpo/ in the wheel, LICENSE in both"
# the tracked files; a checkout without git metadata: every file but bytecode
git ls-files lightning_grpo > "$work/tracked.txt" 2>/dev/null \
  || find lightning_grpo -type f -not -path "*/__pycache__/*" -not -name "*.pyc" | sort > "$work/tracked.txt"
"$TOOLS_VENV/bin/python" - "$work/dist" "$work/tracked.txt" <<'PY'
import re, sys, tarfile, zipfile
from pathlib import Path
dist, tracked = Path(sys.argv[1]), Path(sys.argv[2]).read_text().split()
(wheel,), (sdist,) = dist.glob("*.whl"), dist.glob("*.tar.gz")
names = set(zipfile.ZipFile(wheel).namelist())
missing = [f for f in tracked if f not in names]
assert not missing, f"{wheel.name} lacks {missing}"
extra = sorted(n for n in names if n.startswith("lightning_grpo/") and n not in tracked)
assert not extra, f"{wheel.name} holds files that git does not track: {extra}"
info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
assert f"{info}/licenses/LICENSE" in names, f"{wheel.name} lacks {info}/licenses/LICENSE"
root = sdist.name.removesuffix(".tar.gz")
sdist_names = set(tarfile.open(sdist).getnames())
assert f"{root}/LICENSE" in sdist_names, f"{sdist.name} lacks LICENSE"
version = re.search(r'^__version__ = "(.+)"$', Path("lightning_grpo/__init__.py").read_text(), re.M).group(1)
assert wheel.name.split("-")[1] == version, f"{wheel.name} is not version {version}"
print(f"  {wheel.name}: {len(tracked)} package files + dist-info (LICENSE, entry points); {sdist.name}")
PY

echo "== fresh venv: the README's install lines as written (## Install), in a copy of the checkout"
mkdir "$work/clone"
if git ls-files -z > "$work/files.txt" 2>/dev/null && [[ -s "$work/files.txt" ]]; then
  tar --null -T "$work/files.txt" -cf - | tar -xf - -C "$work/clone"
else  # a checkout without git metadata
  tar --exclude=./.venv --exclude=./.git -cf - . | tar -xf - -C "$work/clone"
fi
"$TOOLS_VENV/bin/python" - README.md > "$work/readme_install.sh" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
print(re.search(r"```bash\n(.*?)```", text[text.index("## Install\n"):], re.S).group(1))
PY
cat "$work/readme_install.sh"
"${PYTHON:-python3}" -m venv "$work/venv"
(cd "$work/clone" && source "$work/venv/bin/activate" && bash -euo pipefail "$work/readme_install.sh" > "$work/install.log" 2>&1) \
  || { tail -40 "$work/install.log"; exit 1; }
mkdir "$work/run"
cd "$work/run"  # outside the checkout: nothing of it on sys.path
cpu_venv_check "$work/venv"
"$work/venv/bin/python" - "$work/venv" "$root" <<'PY'
import json, sys
from importlib.metadata import distribution
from pathlib import Path
import lightning_grpo
venv, root, where = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), Path(lightning_grpo.__file__).resolve()
assert where.is_relative_to(venv) and not where.is_relative_to(root), f"lightning_grpo imported from {where}"
direct = json.loads(distribution("lightning-grpo").read_text("direct_url.json") or "{}")
assert not direct.get("dir_info", {}).get("editable"), f"an editable install: {direct}"
print(f"  lightning_grpo {lightning_grpo.__version__} imported from {where} (installed from {direct.get('url')})")
PY

echo "== 2 quickstart steps with the installed wheel, from $work/run"
LIGHTNING_GRPO_CACHE="$work/cache" "$work/venv/bin/lightning-grpo" fit -c "$root/recipes/quickstart.yaml" \
  --trainer.max_steps 2 --trainer.log_every_n_steps 1 --trainer.enable_progress_bar false
"$work/venv/bin/python" - runs/quickstart/version_0/metrics.csv <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("train/reward_mean")]
assert len(rows) == 2, f"expected 2 logged training steps in {sys.argv[1]}, found {len(rows)}"
print(f"installed wheel trains: {len(rows)} steps, reward {[round(float(r['train/reward_mean']), 3) for r in rows]}")
PY
