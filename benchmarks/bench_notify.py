"""What does a notification inside the committing transaction cost PostgreSQL's commits?

A replica that opens or closes a round sends ``SELECT pg_notify(...)`` on its own connection just
before ``COMMIT`` (``service/store/change_channel.py``). PostgreSQL serialises the commits of
transactions that notified (they queue their notifications under one lock at commit), so this
measures, against the same transactions without a notification and in the same run: N writers
(threads, one connection each) each committing one-row inserts for a few seconds, with and
without a ``pg_notify`` in every transaction, alternately; the ratio is notifying commits per
second over plain ones, per repeat.

The coordinator notifies a handful of times per round (a round opened or closed, a federation
started, stopped or finished; never per upload), so the figure bounds a cost far below any
round's.

    scripts/start-postgres     # a test server (fsync off: commits are cheap, the ratio a floor)
    .venv/bin/python benchmarks/bench_notify.py \\
        --url postgresql://postgres@127.0.0.1:54329/postgres --out runs/bench_notify.json
"""

from __future__ import annotations

import threading
import time
from typing import Any

from _common import benchmark_parser, machine_info, median, write_result

TABLE = "fedaudit_bench_notify"


def _writer(url: str, notify: bool, stop: threading.Event, counts: list[int], i: int) -> None:
    import psycopg

    with psycopg.connect(url) as conn:
        n = 0
        while not stop.is_set():
            with conn.transaction():
                conn.execute(f"INSERT INTO {TABLE} (v) VALUES ('x')")  # noqa: S608
                if notify:
                    conn.execute("SELECT pg_notify('fedaudit_bench', %s)", (str(i),))
            n += 1
        counts[i] = n


def commits_per_second(url: str, notify: bool, writers: int, seconds: float) -> float:
    """Commits per second of ``writers`` threads over ``seconds``."""
    stop = threading.Event()
    counts = [0] * writers
    threads = [
        threading.Thread(target=_writer, args=(url, notify, stop, counts, i))
        for i in range(writers)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; return (and write) the result."""
    import psycopg

    parser = benchmark_parser(__doc__)
    parser.add_argument("--url", required=True, help="a PostgreSQL server to write to")
    parser.add_argument("--writers", default="1,4,16", help="comma-separated writer counts")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, v text)")
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit")
        }
    per_writers: dict[str, Any] = {}
    try:
        for writers in (int(w) for w in args.writers.split(",")):
            plain, notified = [], []
            for _ in range(args.repeats):
                plain.append(commits_per_second(args.url, False, writers, args.seconds))
                notified.append(commits_per_second(args.url, True, writers, args.seconds))
            ratios = [b / a for a, b in zip(plain, notified, strict=True)]
            per_writers[str(writers)] = {
                "plain_commits_per_second": plain,
                "notifying_commits_per_second": notified,
                "ratio_per_repeat": ratios,
                "median_ratio": median(ratios),
            }
            print(
                f"{writers:3d} writers: plain {median(plain):8.0f}/s, with pg_notify "
                f"{median(notified):8.0f}/s, ratio {median(ratios):.2f} (per repeat "
                f"{', '.join(f'{r:.2f}' for r in ratios)})"
            )
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    result = {"machine": machine_info(), "server": settings, "writers": per_writers}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
