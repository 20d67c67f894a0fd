# Shared by the setup_*.sh scripts here (sourced, not run): one peer's own virtual environment, CPU torch first.
#
#   peer_venv VENV PACKAGE==VERSION... -- REQUIREMENT... -- IMPORT_CHECK
#
# Makes VENV (unless VENV/.installed says it is done), installs torch $PEER_TORCH (the local CPU wheel)
# before anything else so that no requirement pulls a CUDA build, then the peer's packages with --no-deps,
# then REQUIREMENT... with torch pinned again (so pip cannot swap it), then runs IMPORT_CHECK (Python) in
# VENV, which must import the peer's training path; it also asserts that torch sees no CUDA.
PEER_TORCH="${PEER_TORCH:-2.13.0}"

peer_venv() {
  local venv="$1"; shift
  local python="${PYTHON:-python3.11}" peers=() reqs=()
  while [ "$1" != "--" ]; do peers+=("$1"); shift; done; shift
  while [ "$1" != "--" ]; do reqs+=("$1"); shift; done; shift
  local check="$1"
  if [ -f "$venv/.installed" ]; then
    echo "venv ready: $venv"; return 0
  fi
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet "torch==$PEER_TORCH"
  "$venv/bin/pip" install --quiet --no-deps "${peers[@]}"
  "$venv/bin/pip" install --quiet "torch==$PEER_TORCH" "${reqs[@]}"
  "$venv/bin/python" -c "import torch; assert not torch.cuda.is_available(), 'a CUDA torch got in'; $check"
  touch "$venv/.installed"
  echo "venv ready: $venv"
}
