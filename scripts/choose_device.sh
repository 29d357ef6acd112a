#!/usr/bin/env bash
# choose_device: which build scripts/install.sh installs, "cpu" or "cuda" (printed on stdout).
#   TEPO_DEVICE=cpu|cuda forces the answer; otherwise "cuda" when nvidia-smi is on PATH and lists a GPU, else "cpu".
# Sourced by install.sh; run on its own it prints the answer (bash scripts/choose_device.sh).
choose_device() {
  case "${TEPO_DEVICE:-}" in
    cpu | cuda)
      echo "$TEPO_DEVICE"
      return 0
      ;;
    "") ;;
    *)
      echo "TEPO_DEVICE must be cpu or cuda (or unset: detect), got '$TEPO_DEVICE'" >&2
      return 2
      ;;
  esac
  # nvidia-smi -L prints one "GPU 0: <name> (UUID: ...)" line per GPU the driver sees.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'; then
    echo cuda
  else
    echo cpu
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  choose_device
fi
