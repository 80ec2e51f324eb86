# Sourced by maze_curriculum.sh and lease.sh: a curriculum run's files brought back from the device, one way for both.
# run_dirs_tgz OUTFILE MC: the run dirs under MC without weights, snapshots or dirs being written (small files only).
run_dirs_tgz() {
  tar czf "$1" -C "$2" --warning=no-file-changed --exclude weights --exclude snapshots --exclude '*.new' --exclude tb \
    --exclude checkpoints .
}
# pack_back MODEL WP: MODEL packed by weights_parts.py into WP (bf16, parts of <= 15.75 MiB), part.00-03 into $OUT.
pack_back() {
  rm -rf "$2" && python3 benchmarks/device/weights_parts.py pack "$1" "$2" && cp "$2"/part.0[0-3] "$OUT/"
}
# unpack_parts DEST: the parts carried into $PARTS unpacked as a model directory DEST.
unpack_parts() {
  rm -rf "$1" && python3 benchmarks/device/weights_parts.py unpack "$PARTS" "$1"
}
# step_split METRICS: a level's SFT steps so far and the median of sft_phase's split of a step (the last line may be
# torn: the run writes it meanwhile).
step_split() {
  python3 -c 'import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append(json.loads(line))
    except ValueError:
        pass
rows = [r for r in rows if r.get("phase") == "sft" and "update_s" in r]
keys = ("batch_s", "to_device_s", "update_s")
if rows:
    medians = ", ".join(f"{k} {statistics.median(r[k] for r in rows):.3f}" for k in keys)
    print(f"  {len(rows)} SFT steps, median s: {medians}")' "$1"
}
