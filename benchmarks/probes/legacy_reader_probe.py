"""What DALI's legacy ``fn.readers.video`` does where crossdali's loaders depend on it (GPU only).

    python -m benchmarks.probes.legacy_reader_probe --out OUT

The legacy reader decodes shuffled 1080p clips several times faster than
``fn.experimental.readers.video`` (docs/benchmarks.md#video-decoding), so the GPU loaders use it.
This records in OUT/legacy_reader_probe.json, on the ``gpu-tiny`` H.264 and VP9 sample set: which
clips it cuts (stride 2: is the rule ``(F-1)*stride+1`` frames or ``F*stride``?), on which device
its labels and frame numbers come out, whether a pipeline with ``enable_checkpointing`` builds, saves
and restores it, whether shards + ``pad_last_batch`` cover every clip once, and the error a VP9 WebM
file gets.
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path


def _pipe(files, labels, *, shard=0, shards=1, shuffle=False, checkpointing=False, batch=4, seq=8, stride=2,
          step=8, frame_num=True):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=2, device_id=0, seed=7, enable_checkpointing=checkpointing)
    def pipe():
        out = fn.readers.video(device="gpu", filenames=list(files), labels=list(labels), sequence_length=seq,
                               stride=stride, step=step, shard_id=shard, num_shards=shards, random_shuffle=shuffle,
                               initial_fill=16, pad_last_batch=True, enable_frame_num=frame_num, dtype=types.UINT8,
                               file_list_include_preceding_frame=True, name="Reader")
        return tuple(out)

    p = pipe()
    p.build()
    return p


def probe(root: Path) -> dict:
    import av
    from nvidia.dali import fn, pipeline_def

    files = sorted(str(p) for p in (root / "h264").rglob("*.mp4"))[:12]
    frames = []
    for f in files:
        with av.open(f) as c:
            frames.append(sum(1 for pkt in c.demux(c.streams.video[0]) if pkt.size))
    labels = list(range(len(files)))
    res: dict = {"files": len(files), "frames_per_file": frames}

    p = _pipe(files, labels, step=17)  # 32-frame files: clips at 0 and 17 need a 15-frame span, 0 only with 16
    outs = p.run()
    res["output_devices"] = [type(o).__name__ for o in outs]
    res["epoch_size_step17"] = p.epoch_size("Reader")
    res["clips_rule_span"] = sum((n - 15) // 17 + 1 for n in frames if n >= 15)  # (8-1)*2+1 frames
    res["clips_rule_seq_x_stride"] = sum((n - 16) // 17 + 1 for n in frames if n >= 16)

    clips = set()
    for shard in range(3):
        p = _pipe(files, labels, shard=shard, shards=3)
        meta = p.reader_meta("Reader")
        n = 0
        want = -(-meta["epoch_size"] // 3) if shard < meta["epoch_size"] % 3 or meta["epoch_size"] % 3 == 0 \
            else meta["epoch_size"] // 3
        got = []
        while n < want:
            c, lbl, fr = (o.as_cpu() for o in p.run())
            for i in range(len(c)):
                got.append((int(lbl.at(i).reshape(-1)[0]), int(fr.at(i).reshape(-1)[0])))
            n = len(got)
        clips.update(got[:want])
        res.setdefault("shard_sizes", []).append(want)
    res["distinct_clips_over_3_shards"] = len(clips)

    try:
        p = _pipe(files, labels, shuffle=True, checkpointing=True)
        first = [float(o.as_cpu().at(0).sum()) for o in [p.run()[0]]]
        state = p.checkpoint()
        after = [float(p.run()[0].as_cpu().at(0).sum()) for _ in range(3)]
        restored = _restore(files, labels, state)
        res["checkpointing"] = {"saved": True, "first": first, "after": after, "restored": restored,
                                "resume_exact": after == restored}
    except Exception as e:  # what DALI says is the answer here
        res["checkpointing"] = {"error": f"{type(e).__name__}: {e}"[:2000], "trace": traceback.format_exc()[-2000:]}

    webm = sorted(str(p) for p in root.rglob("*.webm"))[:2]
    if webm:
        try:
            @pipeline_def(batch_size=2, num_threads=2, device_id=0)
            def vp9():
                return fn.readers.video(device="gpu", filenames=webm, sequence_length=8, name="Reader")
            q = vp9()
            q.build()
            q.run()
            res["vp9_webm"] = "read"
        except Exception as e:
            res["vp9_webm"] = f"{type(e).__name__}: {e}"[:1500]
    return res


def _restore(files, labels, state) -> list[float]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=4, num_threads=2, device_id=0, seed=7, enable_checkpointing=True)
    def pipe():
        return tuple(fn.readers.video(device="gpu", filenames=list(files), labels=list(labels), sequence_length=8,
                                      stride=2, step=8, random_shuffle=True, initial_fill=16, pad_last_batch=True,
                                      enable_frame_num=True, dtype=types.UINT8, file_list_include_preceding_frame=True,
                                      name="Reader"))

    p = pipe(checkpoint=state)
    p.build()
    return [float(p.run()[0].as_cpu().at(0).sum()) for _ in range(3)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from crossdali.common.data.sample_data import BUILDERS, default_root

    root = BUILDERS["video"](default_root(), "gpu-tiny")
    res = probe(Path(root))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "legacy_reader_probe.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1)[:6000])


if __name__ == "__main__":
    main()
