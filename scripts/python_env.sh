# Sourced by demo.sh and test.sh: use the active virtual environment, or create and activate .venv in the
# repository (a fresh Debian/Ubuntu python3 refuses `pip install` outside one), then install the given
# requirements file at the exact versions of constraints.txt (scripts/pin_requirements.sh moves them).
# Usage: source scripts/python_env.sh requirements.txt
if [ -z "${VIRTUAL_ENV:-}" ]; then
  # (a .venv without pip is what a venv made before python3-venv was installed leaves: made again)
  if ! .venv/bin/python -m pip --version >/dev/null 2>&1 && ! python3 -m venv .venv >/dev/null 2>&1; then
    # a stock Debian/Ubuntu python3 has no venv module until python3-venv is installed: as root, install it
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
    python3 -m venv .venv >/dev/null 2>&1 || {
      echo "error: python3 -m venv failed: install it (apt-get install -y python3-venv)" >&2; exit 2; }
  fi
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
python -m pip install -q -c constraints.txt -r "$1"
python -m pip install -q --no-deps -e .
