"""Hostile rollout files for measuring what ``vrl verify`` spends on them (issue 13, section 3).

    python bench/hostile_files.py long  out.msgpack [--tokens 32768]   # one signed long record
    python bench/hostile_files.py storm out.msgpack [--bytes 262144]   # repeated frame markers
    python bench/hostile_files.py crc-storm out.msgpack [--bytes 262144]

* ``long``: one valid, signed record of the ``tiny`` preset with ``--tokens`` completion tokens
  (a group of one, ``finish_reason = "length"``, ``max_new_tokens`` equal to its length). It
  passes stages 1 to 3, so a verifier without a length bound runs the whole prefill before
  stage 4 rejects its commitment (an honest 4-token commitment: building a real one would need
  the very prefill being measured).
* ``storm``: the file header, then ``"VRLR"`` repeated: every 4 bytes a frame marker whose
  length field (``"VRLR"`` again) is oversized.
* ``crc-storm``: the header, then frame headers every 16 bytes, each claiming a payload that runs
  to the end of the file with a wrong checksum: a reader that checksums every candidate does
  quadratic work.

Measure with ``/usr/bin/time -v vrl verify FILE --model tiny --json > /dev/null``.
"""

from __future__ import annotations

import argparse
import struct
from dataclasses import replace
from pathlib import Path

FRAME_MAGIC = b"VRLR"
FILE_MAGIC = b"VRLROLL\x01"


def long_record(path: Path, tokens: int) -> None:
    import vrl

    model = vrl.load_model("tiny")
    key = vrl.NodeKey.from_seed(b"bench-long-record".ljust(32, b"\0"))
    sampling = vrl.sampling_for(model, max_new_tokens=4)
    (rollout,) = vrl.generate(model, vrl.Arithmetic(digits=1), key, round_seed=bytes(32), sampling=sampling,
                              groups=1, group_size=1)
    digit = model.encode("7")[0]  # never a stop token: the record ends by length, as it claims
    long = rollout.signed(key, completion_tokens=(digit,) * tokens, behaviour_logprobs=(-1.0,) * tokens,
                          finish_reason="length", sampling=replace(sampling, max_new_tokens=tokens), reward=0.0)
    vrl.write_rollouts(path, [long])


def storm(path: Path, size: int) -> None:
    path.write_bytes(FILE_MAGIC + FRAME_MAGIC * (size // 4))


def crc_storm(path: Path, size: int) -> None:
    period = 16
    count = size // period
    body = bytearray()
    for i in range(count):
        remaining = (count - i) * period - 12  # this candidate's payload runs to the end of the file
        body += struct.pack(">4sII", FRAME_MAGIC, remaining, 0) + b"\x00" * (period - 12)
    path.write_bytes(FILE_MAGIC + bytes(body))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("long", "storm", "crc-storm"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--bytes", type=int, default=256 << 10)
    args = parser.parse_args()
    if args.kind == "long":
        long_record(args.out, args.tokens)
    elif args.kind == "storm":
        storm(args.out, args.bytes)
    else:
        crc_storm(args.out, args.bytes)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
