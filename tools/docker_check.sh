#!/usr/bin/env bash
# Build the cpu image and run it the way the README does, before a release:
#
#   tools/docker_check.sh
#
# With podman or docker, whichever is installed (ENGINE chooses); with neither it says so and
# exits 0. Each step runs the image as users do, and the script stops at the first that fails:
#   1. build --target cpu from a copy of the tracked files (build time, image size), then again
#      after an edit of README.md alone: only the last layers are rebuilt, not torch;
#   2. the default user (uid 1000) downloads digits into a fresh named /cache volume;
#   3. another uid (RUN_AS, by --user) adds a dataset to the same cache, from a folder mounted
#      read-only at /data;
#   4. RUN_AS trains on digits read-only at /data and indexes them into a host folder it owns,
#      mounted at /work;
#   5. the README's stdin pipeline: find ... | run -i ... query - --format jsonl;
#   6. `serve` with no BUNDLE answers /health on a published port.
#
# Environment:
#   ENGINE       podman or docker (default: podman where installed, else docker)
#   IMAGE        the tag built (default: pactl:check)
#   RUN_AS       uid:gid for --user (default: yours; 1234:1234 when you are root)
#   TORCH_INDEX  where pip takes torch (default: the Dockerfile's, PyTorch's CPU index); use
#                https://pypi.org/simple where that index is unreachable (a CUDA build of
#                torch, several GB more)
#   BASE_IMAGE   the cpu stage's FROM (default: the Dockerfile's PYTHON_IMAGE)
#   STAND_IN=1   where no registry of base images is reachable: make BASE_IMAGE (default then
#                localhost/pactl-stand-in:bookworm) with debootstrap, as root: Debian 12 with
#                python3 and pip (Python 3.11, as python:3.11-slim), trusting this machine's
#                extra CA certificates (/usr/local/share/ca-certificates) so that pip in the
#                build passes a proxy this machine trusts; then `$ENGINE import`. Made once,
#                kept; DEBIAN_MIRROR names the mirror.
#   PORT         host port for the serve check (default: 18000)
#   CONTAINERS_CONF  podman's own configuration file. Where crun cannot run, `[engine]` with
#                `runtime = "runc"` selects runc; where runc cannot set podman's default limits
#                ("error setting rlimit"), `[containers]` with
#                `default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]` (at most the
#                machine's own limits) sets them lower.
set -euo pipefail
{  # read whole before it runs: an edit of this file while it runs changes nothing

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${IMAGE:-pactl:check}
PORT=${PORT:-18000}

if [ -z "${ENGINE:-}" ]; then
  if command -v podman >/dev/null; then ENGINE=podman
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  else
    echo "docker_check: neither podman nor a running docker engine is here; nothing checked"
    exit 0
  fi
fi
if [ -z "${RUN_AS:-}" ]; then
  RUN_AS="$(id -u):$(id -g)"
  [ "$RUN_AS" = "0:0" ] && RUN_AS=1234:1234  # root: a uid of no user in the image instead
fi

say() { echo "docker_check: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

make_stand_in() {
  command -v debootstrap >/dev/null || fail "STAND_IN=1 needs debootstrap (apt-get install debootstrap)"
  local fs
  fs=$(mktemp -d)/rootfs
  say "making the stand-in base $BASE_IMAGE with debootstrap (minutes)"
  debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
    bookworm "$fs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
  # As in python:3.11-slim, pip may install into the image's own Python (no PEP 668 marker).
  rm -f "$fs"/usr/lib/python3*/EXTERNALLY-MANAGED
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$fs/usr/local/share/ca-certificates/"
    chroot "$fs" update-ca-certificates >&2
  fi
  rm -rf "$fs"/var/cache/apt/archives/*.deb "$fs"/var/lib/apt/lists/*
  tar -C "$fs" -c . | "$ENGINE" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    - "$BASE_IMAGE" >&2
  rm -rf "$(dirname "$fs")"
}

build_args=()
if [ "${STAND_IN:-0}" = 1 ]; then
  BASE_IMAGE=${BASE_IMAGE:-localhost/pactl-stand-in:bookworm}
  "$ENGINE" image inspect "$BASE_IMAGE" >/dev/null 2>&1 || make_stand_in
fi
[ -n "${BASE_IMAGE:-}" ] && build_args+=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE")
[ -n "${TORCH_INDEX:-}" ] && build_args+=(--build-arg "TORCH_INDEX=$TORCH_INDEX")

SCRATCH=$(mktemp -d)
VOLUME=pactl-check-cache-$$
SERVER=pactl-check-serve-$$
# shellcheck disable=SC2317  # run by the trap
cleanup() {
  "$ENGINE" rm -f "$SERVER" >/dev/null 2>&1 || true
  "$ENGINE" volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

# 1. Build from the tracked files (and new ones git does not ignore), as a clone would.
mkdir "$SCRATCH/context"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 tar -c) | tar -C "$SCRATCH/context" -x
build() {
  local start=$SECONDS
  "$ENGINE" build --target cpu -t "$IMAGE" ${build_args[@]+"${build_args[@]}"} "$SCRATCH/context" >&2
  echo $((SECONDS - start))
}
say "building $IMAGE with $ENGINE (${build_args[*]:-no build args})"
first=$(build)
size=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")
echo "build: ${first} s, image size: $(awk -v b="$size" 'BEGIN { printf "%.2f GB", b / 1e9 }')"
echo "a line added by docker_check" >>"$SCRATCH/context/README.md"
again=$(build)
echo "rebuild after an edit of README.md: ${again} s"

run() { "$ENGINE" run --rm "$@"; }

# 2. The default user fills a fresh cache volume.
"$ENGINE" volume create "$VOLUME" >/dev/null
run -v "$VOLUME:/cache" "$IMAGE" download digits --quiet || fail "download digits as uid 1000"
echo "uid 1000: digits downloaded into the volume"

# 3. Another uid adds a dataset to the cache uid 1000 made: a CUB-200 layout of 40 digits
#    (images.txt, image_class_labels.txt, classes.txt, images/), read-only at /data.
uid=${RUN_AS%%:*} gid=${RUN_AS##*:}
data=$SCRATCH/data work=$SCRATCH/work
mkdir -p "$data" "$work"
[ "$(id -u)" = 0 ] && chown "$uid:$gid" "$data" "$work"
chmod 0755 "$work"  # only its owner may write there: uid 1000 could not
run --user "$RUN_AS" -v "$VOLUME:/cache:ro" -v "$data:/out" --entrypoint cp "$IMAGE" \
  -r /cache/pactl/datasets/digits /out/digits || fail "copy digits out of the volume"
cub=$data/CUB_200_2011
mkdir -p "$cub/images"
n=0
for label in 0 1 2 3; do
  mkdir -p "$cub/images/$label"
  echo "$((label + 1)) $label" >>"$cub/classes.txt"
  pngs=("$data/digits/$label"/*.png)
  for png in "${pngs[@]:0:10}"; do
    n=$((n + 1))
    cp "$png" "$cub/images/$label/"
    echo "$n $label/${png##*/}" >>"$cub/images.txt"
    echo "$n $((label + 1))" >>"$cub/image_class_labels.txt"
  done
done
run --user "$RUN_AS" -v "$VOLUME:/cache" -v "$data:/data:ro" "$IMAGE" \
  download cub200 --from /data/CUB_200_2011 --quiet || fail "download cub200 as uid $uid"
echo "uid $uid: cub200 (40 images) added to the cache uid 1000 made"

# 4. Train on the digits folder, read-only at /data, and index its test images as RUN_AS,
#    into the host folder it owns.
as_user=(--user "$RUN_AS" -v "$VOLUME:/cache" -v "$work:/work")
run "${as_user[@]}" -v "$data:/data:ro" "$IMAGE" \
  train /data/digits --preset digits --name check --epochs 2 --quiet \
  || fail "train /data/digits as uid $uid"
run "${as_user[@]}" -v "$data:/data:ro" "$IMAGE" index --quiet || fail "index as uid $uid"
owner=$(stat -c %u:%g "$work/runs/check/index/meta.json")
[ "$owner" = "$RUN_AS" ] || fail "the bundle is owned by $owner, not $RUN_AS"
echo "uid $uid: trained and indexed into runs/check/index (owned by $owner)"

# 5. The README's pipeline, with queries mounted read-only.
mkdir -p "$work/queries"
pngs=("$data/digits/7"/*.png)
cp "${pngs[@]:0:5}" "$work/queries/"
[ "$(id -u)" = 0 ] && chown -R "$uid:$gid" "$work/queries"
queries=$(find "$work/queries" -name '*.png' | wc -l)
(cd "$work" && find queries -name '*.png' | "$ENGINE" run --rm -i --user "$RUN_AS" \
  -v "$VOLUME:/cache" -v "$work:/work" -v "$work/queries:/work/queries:ro" \
  "$IMAGE" query - --k 4 --format jsonl >"$SCRATCH/hits.jsonl") || fail "the query pipeline"
lines=$(wc -l <"$SCRATCH/hits.jsonl")
[ "$lines" -eq $((queries * 4)) ] || fail "$lines lines of jsonl for $queries queries, --k 4"
echo "pipeline: $queries queries, $lines lines of jsonl (one a hit); the first:"
head -n 1 "$SCRATCH/hits.jsonl"

# 6. serve with no BUNDLE finds the bundle `pactl index` wrote.
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
"$ENGINE" run -d --name "$SERVER" -p "127.0.0.1:$PORT:8000" "${as_user[@]}" \
  -e PACTL_TOKEN="$token" "$IMAGE" serve --host 0.0.0.0 --quiet >/dev/null
for _ in $(seq 60); do
  health=$(curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:$PORT/health" 2>/dev/null) \
    && break
  sleep 2
done
[ -n "${health:-}" ] || { "$ENGINE" logs "$SERVER" >&2; fail "serve answered no /health"; }
echo "serve: /health answered $health"
say "all checks passed"
exit 0
}
