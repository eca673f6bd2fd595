"""Command line: ``python -m grader {release,bundle,collect,autograde,report,selfcheck,demo,time,bench}`` (run from the
repository root)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("release", help="solutions/ -> course/*.ipynb (nbgrader generate_assignment)")
    r.add_argument("chapters", nargs="*", help="chapter ids (default: all)")

    b = sub.add_parser("bundle", help="what students receive: notebooks, coursekit, kernels, data, `make lab`")
    b.add_argument("out", type=Path, help="a new or empty folder, or an earlier bundle (replaced; its .git kept)")
    b.add_argument("--zip", type=Path, default=None, help="also write this zip archive of the bundle")

    c = sub.add_parser("collect", help="a folder of downloaded notebooks -> OUT/<student_id>/<chapter_id>/<chapter_id>.ipynb")
    c.add_argument("src", type=Path, help="<student>_<chapter>.ipynb, <student>/<chapter>.ipynb or Canvas's names")
    c.add_argument("out", type=Path, help="the submissions folder that autograde reads (created if missing)")
    c.add_argument("--replace", action="store_true", help="replace notebooks already collected in OUT with other content")

    a = sub.add_parser("autograde", help="grade SUBMISSIONS/<student_id>/<chapter_id>/<chapter_id>.ipynb")
    a.add_argument("submissions", type=Path)
    a.add_argument("--out", type=Path, required=True, help="writes grades.csv, feedback/, gradebook.db")
    a.add_argument("--workers", type=int, default=1, help="submissions graded in parallel (default 1)")
    a.add_argument("--timeout", type=float, default=None,
                   help="CPU seconds allowed per graded cell (default 60; the wall-clock backstop is 5 times that)")
    a.add_argument("--db", default=None, help="gradebook URL (default sqlite:///OUT/gradebook.db)")
    a.add_argument("--unisolated", action="store_true",
                   help="grade even where the sandbox cannot isolate submissions (not root, no cgroups or "
                        "seccomp); every grade is then flagged for regrading")
    a.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="grade on the workers of this Dask scheduler (tcp://HOST:8786; see grader/cluster.py); "
                        "this machine still reads the submissions and writes every result")

    rp = sub.add_parser("report", help="the class's scores, failure reasons, missing work and an LMS gradebook CSV")
    rp.add_argument("out", type=Path, help="autograde's OUT: its gradebook, feedback/, timing.csv, not_graded.csv")
    rp.add_argument("--db", default=None, help="gradebook URL (default sqlite:///OUT/gradebook.db)")
    rp.add_argument("--to", type=Path, default=None, help="folder of the report (default OUT/report)")
    rp.add_argument("--roster", type=Path, default=None,
                    help="the class's student ids, one per line (or a CSV with a student_id column first)")

    s = sub.add_parser("selfcheck", help="reference solutions score full marks, blank releases 0")
    s.add_argument("chapters", nargs="*", help="chapter ids (default: all)")
    s.add_argument("--workers", type=int, default=2)

    d = sub.add_parser("demo", help="lecture dashboards: the chapters' slider demos served by Voila")
    d.add_argument("chapters", nargs="*", help="chapter ids (default: all with a demo cell)")
    d.add_argument("--port", type=int, default=8866)
    d.add_argument("--build-only", action="store_true", help="write build/demo/ and exit")
    d.add_argument("--warm", action="store_true",
                   help="run each dashboard once and save its measurements, so that it opens in seconds "
                        "(chapters already saved for this version are skipped), then exit")
    d.add_argument("--force", action="store_true", help="with --warm: measure again even what is saved")

    t = sub.add_parser("time", help="wall time of each solved chapter, top to bottom (full mode)")
    t.add_argument("chapters", nargs="*", help="chapter ids (default: all)")
    t.add_argument("--fast", action="store_true", help="fast mode (COURSE_FAST=1), as the tests run")
    t.add_argument("--save", type=Path, default=None, help="directory for the executed notebooks")

    sub.add_parser("bench", help="slow benchmarks: the course's models, then each chapter's declared kernel")

    args = p.parse_args(argv)
    try:
        if args.command == "release":
            from grader.release import release

            for path in release(args.chapters or None):
                print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
            return 0
        if args.command == "bundle":
            from grader.bundle import build

            files = build(args.out, zip_path=args.zip)
            print(f"wrote {len(files)} files to {args.out}" + (f" and {args.zip}" if args.zip else ""))
            return 0
        if args.command == "collect":
            from grader.collect import collect, log_path

            entries = collect(args.src, args.out, replace=args.replace)
            for e in entries:
                if e.status == "skipped" or e.reason:
                    print(f"{e.status}: {e.path}: {e.reason}")
            done = sum(e.status in ("collected", "replaced") for e in entries)
            skipped = sum(e.status == "skipped" for e in entries)
            print(f"collected {done} notebook(s) into {args.out}" + (f"; {skipped} file(s) not collected (listed above "
                  f"and in {log_path(args.out)})" if skipped else ""))
            return 0
        if args.command == "autograde":
            if args.workers < 1:
                p.error(f"--workers must be at least 1, got {args.workers}")
            if args.timeout is not None and args.timeout <= 0:
                p.error(f"--timeout must be positive, got {args.timeout}")
            if args.scheduler:  # on a Dask cluster (grader/cluster.py): Dask is imported only then
                from functools import partial

                from grader.cluster import autograde_on

                autograde = partial(autograde_on, args.scheduler)
            else:
                from grader.autograde import autograde
            results = autograde(args.submissions, args.out, workers=args.workers, timeout=args.timeout,
                                db_url=args.db, unisolated=args.unisolated)
            for r in results:
                flag = "  [UNISOLATED]" if r.unisolated else ""
                print(f"{r.student:<20} {r.chapter:<24} {r.score:g}/{r.max_score:g}{flag}" + (f"  ({r.note})" if r.note else ""))
            with (args.out / "not_graded.csv").open() as f:
                skipped = sum(1 for _ in f) - 1
            print(f"wrote {args.out / 'grades.csv'} and {args.out / 'feedback'}/ for {len(results)} submission(s)"
                  + (f"; {skipped} entr{'y' if skipped == 1 else 'ies'} not graded (listed above and in "
                     f"{args.out / 'not_graded.csv'})" if skipped else ""))
            return 0
        if args.command == "report":
            from grader.report import report

            written = report(args.out, db_url=args.db, dest=args.to, roster=args.roster)
            print(f"wrote {written[0]} and {', '.join(p.name for p in written[1:])} beside it")
            return 0
        if args.command == "selfcheck":
            from grader.selfcheck import selfcheck

            return 0 if selfcheck(args.chapters or None, workers=args.workers) else 1
        if args.command == "demo":
            from grader import demo

            if args.force and not args.warm:
                p.error("--force goes with --warm")
            if args.warm:
                from grader.demo_warm import warm

                results = warm(args.chapters or None, force=args.force)
                for r in results:
                    print(f"{r.chapter:<24} {r.status:<8} {r.seconds:6.1f} s  {r.note}")
                failed = [r.chapter for r in results if r.status == "failed"]
                if failed:
                    print(f"error: {len(failed)} dashboard(s) not saved: {', '.join(failed)}", file=sys.stderr)
                return 1 if failed else 0
            if args.build_only:
                for ch in demo.build(chapter_ids=args.chapters or None):
                    print(f"wrote {demo.BUILD / ch}.ipynb")
                return 0
            demo.serve(args.port, chapter_ids=args.chapters or None)
        if args.command == "bench":
            from coursekit.bench import main as bench_main
            from grader.chapters import kernel_modules

            bench_main(kernel_modules())
            return 0
        if args.command == "time":
            from grader.timing import main as time_main

            results = time_main(args.chapters or None, fast=args.fast, save=args.save)
            return 1 if any(r.error for r in results) else 0
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
