#!/usr/bin/env python3
"""The release's assets that every build machine makes the same way: the CLI's archive
and dist/SHA256SUMS. Python (standard library only), so the Linux build
(scripts/release.sh) and the macOS and Windows runners of the release workflow
(.github/workflows/release.yml) share one implementation.

  release_assets.py cli --bin PATH --target TRIPLE --version V --dist DIR
                        --extras DIR [--run PREFIX] [--no-run] [--epoch SECONDS]
      Runs the CLI once (`--version` must say `tgsync V`; under PREFIX, e.g.
      qemu-aarch64, when given), has it write its manual pages and every shell's
      completion script into the extras directory when that holds none yet (the first
      CLI that runs writes them for every archive), and packs
      tgsync-V/{tgsync[.exe],LICENSE,README.md,man/,completions/} into
      DIR/tgsync-V-TRIPLE.tar.gz (a Windows target: .zip). Reproducible: sorted names,
      owned by root, every file dated SECONDS (the commit's time), gzip without a
      timestamp. --no-run packs without running (a build that cannot run the target's
      binaries; never a tagged release).

  release_assets.py sums DIR
      Writes DIR/SHA256SUMS (as `sha256sum` writes it) over every other file of DIR.
"""

import argparse
import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

# Each shell's completion script, under the name that shell looks for.
COMPLETIONS = [
    ("bash", "tgsync.bash"),
    ("zsh", "_tgsync"),
    ("fish", "tgsync.fish"),
    ("powershell", "_tgsync.ps1"),
    ("elvish", "tgsync.elv"),
]


def fail(message):
    sys.exit(f"scripts/release_assets.py: {message}")


def run(command):
    """Runs `command`, returning its stdout; its failure ends the script."""
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    if done.returncode != 0:
        fail(f"{' '.join(command)} exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def write_extras(cli, extras):
    """The manual pages and completion scripts `cli` writes, into `extras`."""
    run(cli + ["man", "--dir", os.path.join(extras, "man")])
    os.makedirs(os.path.join(extras, "completions"), exist_ok=True)
    for shell, name in COMPLETIONS:
        with open(os.path.join(extras, "completions", name), "wb") as out:
            out.write(run(cli + ["completions", shell]))
    if not os.path.getsize(os.path.join(extras, "man", "tgsync.1")):
        fail(f"{' '.join(cli)} man wrote an empty tgsync.1")


def members(bin_path, extras, root):
    """(name in the archive, path on disk, executable) of every file, sorted."""
    files = [(f"{root}/{os.path.basename(bin_path)}", bin_path, True)]
    files += [(f"{root}/{name}", name, False) for name in ("LICENSE", "README.md")]
    for sub in ("man", "completions"):
        directory = os.path.join(extras, sub)
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                files.append((f"{root}/{sub}/{name}", os.path.join(directory, name), False))
    return sorted(files)


def pack_tar(out, files, epoch):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        directories = sorted({name.rsplit("/", 1)[0] for name, _, _ in files})
        for d in directories:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
            tar.addfile(info)
        for name, path, executable in files:
            info = tarfile.TarInfo(name)
            info.size = os.path.getsize(path)
            info.mode = 0o755 if executable else 0o644
            info.mtime = epoch
            with open(path, "rb") as f:
                tar.addfile(info, f)
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(buffer.getvalue())


def pack_zip(out, files, epoch):
    import time

    # A zip's times are calendar times (here UTC), from 1980 on.
    stamp = time.gmtime(max(epoch, 315532800))[:6]
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, path, executable in files:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            with open(path, "rb") as f:
                z.writestr(info, f.read())


def cli(args):
    os.makedirs(args.extras, exist_ok=True)
    runner = args.run.split() if args.run else []
    command = runner + [os.path.abspath(args.bin)]
    extras_written = os.path.isfile(os.path.join(args.extras, "man", "tgsync.1"))
    if args.no_run:
        print(f"not run: {args.bin} ({args.target} does not run here)", file=sys.stderr)
    else:
        said = run(command + ["--version"]).decode().strip()
        if said != f"tgsync {args.version}":
            fail(f"{args.bin} --version says {said!r}, not 'tgsync {args.version}'")
        print(f"{args.bin} --version: {said}" + (f" (under {runner[0]})" if runner else ""), file=sys.stderr)
        if not extras_written:
            write_extras(command, args.extras)
            extras_written = True
    if not extras_written:
        print(f"the CLI for {args.target} ships without manual pages and completions (no CLI so far ran here)", file=sys.stderr)
    root = f"tgsync-{args.version}"
    files = members(args.bin, args.extras, root)
    windows = "windows" in args.target
    out = os.path.join(args.dist, f"{root}-{args.target}.{'zip' if windows else 'tar.gz'}")
    (pack_zip if windows else pack_tar)(out, files, args.epoch)
    names = [name for name, _, _ in files]
    if extras_written and f"{root}/man/tgsync.1" not in names:
        fail(f"{out} holds no man/tgsync.1")
    print(f"{os.path.basename(out)}: {len(names)} files, {os.path.getsize(out)} bytes", file=sys.stderr)


def sums(args):
    if not os.path.isdir(args.dir):
        fail(f"{args.dir} is not a directory")
    names = sorted(n for n in os.listdir(args.dir) if n != "SHA256SUMS" and os.path.isfile(os.path.join(args.dir, n)))
    if not names:
        fail(f"{args.dir} holds no assets")
    lines = []
    for name in names:
        digest = hashlib.sha256()
        with open(os.path.join(args.dir, name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        lines.append(f"{digest.hexdigest()}  {name}\n")
    with open(os.path.join(args.dir, "SHA256SUMS"), "w", newline="\n") as out:
        out.writelines(lines)
    print(f"SHA256SUMS: {len(names)} assets", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    c = commands.add_parser("cli", help="pack one CLI's archive")
    c.add_argument("--bin", required=True)
    c.add_argument("--target", required=True)
    c.add_argument("--version", required=True)
    c.add_argument("--dist", required=True)
    c.add_argument("--extras", required=True)
    c.add_argument("--run", default="")
    c.add_argument("--no-run", action="store_true")
    c.add_argument("--epoch", type=int, default=0)
    s = commands.add_parser("sums", help="write SHA256SUMS over a directory's assets")
    s.add_argument("dir")
    args = parser.parse_args()
    {"cli": cli, "sums": sums}[args.command](args)


if __name__ == "__main__":
    main()
