# The A/B scripts' datasets (sourced): the same bytes in every script and every run.

# ab_big DIR: one 1 GiB file of random bytes, DIR/f.
ab_big() {
  mkdir -p "$1"
  head -c $((1 << 30)) /dev/urandom > "$1/f"
}

# ab_small DIR [COUNT] [DIRS]: COUNT (20 000) files of 4 KiB in DIRS (100) directories, seeded.
ab_small() {
  python3 - "$1" "${2:-20000}" "${3:-100}" <<'PY'
import os, sys, random
r = random.Random(1)
for i in range(int(sys.argv[2])):
    d = os.path.join(sys.argv[1], f"d{i % int(sys.argv[3])}")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, f"f{i}"), "wb").write(r.randbytes(4096))
PY
}
