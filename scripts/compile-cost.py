#!/usr/bin/env python3
"""What `#[idempotent]` handlers cost to compile, against plain `async fn`s.

Generates two library crates with the same N handler bodies on SQLite, one plain and
one under the attribute, builds each against warm dependencies, and prints the median
of a few rounds for `cargo check` and a debug build, the rlib's size and each
handler's future size. The two crates' builds alternate, round by round. On a shared or
busy machine the medians still move by 5-10% from run to run: take 11 rounds or more
before comparing two expansions. Run from anywhere in the workspace:

    python3 scripts/compile-cost.py            # 50 handlers, 3 rounds
    python3 scripts/compile-cost.py --handlers 200 --rounds 11
    python3 scripts/compile-cost.py --form batch      # or --form claim
    python3 scripts/compile-cost.py --instructions    # also rustc's instruction counts

With --instructions it also counts the instructions rustc executes for each crate's
`cargo check` and debug build, under valgrind's callgrind (all of rustc's threads): a
figure that stays the same from run to run whatever else the machine does, to compare
two expansions by where timings move too much. It takes a few minutes more.

The crates live in a temporary directory (kept with --keep), with a target directory
of their own so that nothing of the workspace's builds is touched.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import tempfile
import time

WORKSPACE = pathlib.Path(__file__).resolve().parent.parent

# The crate of plain functions and the crate of handlers, in the order they are built.
CRATES = ("plain", "inbox")

MANIFEST = """\
[package]
name = "{name}"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
diesel = {{ version = "~2.3.9", default-features = false, features = ["sqlite"] }}
diesel-async = {{ version = "0.9", features = ["sqlite"] }}
diesel-inbox = {{ path = "{workspace}", features = ["sqlite"] }}
"""

PRELUDE = """\
use diesel::result::Error;
use diesel::sql_types::BigInt;
use diesel::sqlite::SqliteConnection;
use diesel_async::RunQueryDsl;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

pub type Conn = SyncConnectionWrapper<SqliteConnection>;

pub struct Msg {
    pub id: i64,
}

"""

# Per form: the attribute's arguments, the message parameter's type, and the body.
FORMS = {
    "transaction": (
        "key = msg.id",
        "msg: &Msg",
        """\
    diesel::sql_query("UPDATE counters SET n = n + 1 WHERE id = ?")
        .bind::<BigInt, _>(msg.id)
        .execute(conn)
        .await?;
    Ok(())
""",
    ),
    "claim": (
        "key = msg.id, claim",
        "msg: &Msg",
        """\
    diesel::sql_query("UPDATE counters SET n = n + 1 WHERE id = ?")
        .bind::<BigInt, _>(msg.id)
        .execute(conn)
        .await?;
    Ok(())
""",
    ),
    "batch": (
        "batch = msgs, key = |msg| msg.id",
        "msgs: &[Msg]",
        """\
    for msg in msgs {
        diesel::sql_query("UPDATE counters SET n = n + 1 WHERE id = ?")
            .bind::<BigInt, _>(msg.id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
""",
    ),
}

SIZES = """\
fn future_size<F: std::future::Future>(_: impl FnOnce(&'static mut Conn, &'static {message}) -> F) -> usize {{
    std::mem::size_of::<F>()
}}

#[test]
fn future_sizes() {{
    let sizes = [{calls}];
    println!("FUTURE_SIZES {{sizes:?}}");
}}
"""


def handlers(count, attribute, form):
    arguments, parameter, body = FORMS[form]
    code = [PRELUDE]
    for index in range(count):
        if attribute:
            code.append(f'#[diesel_inbox::idempotent(consumer = "h{index}", {arguments})]\n')
        code.append(f"pub async fn h{index}(conn: &mut Conn, {parameter}) -> Result<(), Error> {{\n")
        code.append(body)
        code.append("}\n\n")
    return "".join(code)


def future_size_test(count, form):
    message = FORMS[form][1].split(": &", 1)[1]
    calls = ", ".join(f"future_size(h{index})" for index in range(count))
    sizes = SIZES.format(calls=calls, message=message)
    return "#[cfg(test)]\nmod sizes {\n    use super::*;\n\n" + sizes + "}\n"


def cargo(args, root, target):
    # Without incremental compilation, which would reuse a touched crate's previous
    # build and measure next to nothing.
    environment = dict(os.environ, CARGO_TARGET_DIR=str(target), CARGO_INCREMENTAL="0")
    started = time.monotonic()
    result = subprocess.run(
        ["cargo", *args], cwd=root, env=environment, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"cargo {' '.join(args)} failed in {root}:\n{result.stderr}")
    return time.monotonic() - started, result.stdout


def median_seconds(command, root, target, rounds):
    """The median seconds of `cargo <command> -p <crate>` for each crate, the crates'
    builds alternating round by round, so that a change in the machine's load over the
    measurement weighs on both alike."""
    times = {name: [] for name in CRATES}
    for _ in range(rounds):
        for name in CRATES:
            crate = root / name
            (crate / "src" / "lib.rs").touch()
            seconds, _ = cargo([command, "-p", name], crate, target)
            times[name].append(seconds)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


# Runs rustc under callgrind for the crate being built (cargo's
# RUSTC_WORKSPACE_WRAPPER), its counts in OUT_DIR/<crate>.out.
CALLGRIND_WRAPPER = """\
#!/bin/sh
rustc=$1
shift
name=unknown
previous=
for argument in "$@"; do
    [ "$previous" = "--crate-name" ] && name=$argument
    previous=$argument
done
exec valgrind --tool=callgrind --cache-sim=no --callgrind-out-file="{out_dir}/$name.out" \\
    "$rustc" "$@" 2>"{out_dir}/$name.log"
"""


def instructions(command, root, target):
    """rustc's instructions for `cargo <command> -p <crate>`, for each crate."""
    out_dir = root / "callgrind"
    out_dir.mkdir(exist_ok=True)
    wrapper = out_dir / "rustc-under-callgrind"
    wrapper.write_text(CALLGRIND_WRAPPER.format(out_dir=out_dir))
    wrapper.chmod(0o755)
    counts = {}
    for name in CRATES:
        crate = root / name
        (crate / "src" / "lib.rs").touch()
        environment = dict(
            os.environ,
            CARGO_TARGET_DIR=str(target),
            CARGO_INCREMENTAL="0",
            RUSTC_WORKSPACE_WRAPPER=str(wrapper),
        )
        subprocess.run(
            ["cargo", command, "-p", name, "--lib"],
            cwd=crate,
            env=environment,
            check=True,
            capture_output=True,
        )
        summary = next(
            line
            for line in (out_dir / f"{name}.out").read_text().splitlines()
            if line.startswith("summary:")
        )
        counts[name] = int(summary.split()[1])
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handlers", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--form", choices=sorted(FORMS), default="transaction")
    parser.add_argument("--keep", action="store_true", help="keep the generated crates")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count rustc's instructions under callgrind (valgrind)",
    )
    options = parser.parse_args()

    root = pathlib.Path(tempfile.mkdtemp(prefix="inbox-compile-cost-"))
    target = root / "target"
    (root / "Cargo.toml").write_text('[workspace]\nmembers = ["plain", "inbox"]\nresolver = "3"\n')
    lockfile = WORKSPACE / "Cargo.lock"
    if lockfile.exists():
        # The workspace's versions, so that the figures are of the code under test.
        shutil.copy(lockfile, root / "Cargo.lock")
    for name, attribute in zip(CRATES, (False, True)):
        crate = root / name
        (crate / "src").mkdir(parents=True)
        (crate / "Cargo.toml").write_text(MANIFEST.format(name=name, workspace=WORKSPACE))
        (crate / "src" / "lib.rs").write_text(
            handlers(options.handlers, attribute, options.form)
            + future_size_test(options.handlers, options.form)
        )

    # Dependencies once, outside the measurement.
    cargo(["build", "--workspace", "--tests"], root, target)
    cargo(["check", "--workspace"], root, target)

    checks = median_seconds("check", root, target, options.rounds)
    builds = median_seconds("build", root, target, options.rounds)
    rows = {}
    for name in CRATES:
        crate = root / name
        check, build = checks[name], builds[name]
        rlib = target / "debug" / f"lib{name}.rlib"
        _, output = cargo(["test", "-p", name, "--lib", "--", "--nocapture"], crate, target)
        sizes = next(
            json.loads(line.split(" ", 1)[1])
            for line in output.splitlines()
            if line.startswith("FUTURE_SIZES ")
        )
        rows[name] = (check, build, rlib.stat().st_size, min(sizes), max(sizes))

    print(f"{options.handlers} {options.form} handlers, median of {options.rounds} rounds")
    print(f"{'':8}{'check s':>9}{'build s':>9}{'rlib MB':>9}{'future B':>13}")
    for name, (check, build, rlib, smallest, largest) in rows.items():
        future = f"{smallest}" if smallest == largest else f"{smallest}-{largest}"
        print(f"{name:8}{check:9.2f}{build:9.2f}{rlib / 1e6:9.1f}{future:>13}")
    plain, inbox = rows["plain"], rows["inbox"]
    print(
        f"{'ratio':8}{inbox[0] / plain[0]:9.2f}{inbox[1] / plain[1]:9.2f}"
        f"{inbox[2] / plain[2]:9.2f}"
    )
    if options.instructions:
        print("rustc's instructions (callgrind, all threads), millions")
        for command in ("check", "build"):
            counts = instructions(command, root, target)
            plain, inbox = counts["plain"], counts["inbox"]
            print(
                f"{command:8}plain {plain / 1e6:,.0f}  inbox {inbox / 1e6:,.0f}  "
                f"ratio {inbox / plain:.2f}  per handler "
                f"{(inbox - plain) / options.handlers / 1e6:.1f} more"
            )
    if options.keep:
        print(f"crates kept in {root}")
    else:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
