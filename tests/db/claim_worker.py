"""A job-claiming worker process for the concurrency tests (not a test module).

    python tests/db/claim_worker.py URL OWNER

Prints ``ready``, waits for a line on stdin (so that every worker starts claiming at once), then claims jobs one
transaction each until none is left, and prints the ids it claimed as one JSON list.
"""

import json
import sys

from db.repositories.jobs import claim_next
from db.session import Database


def main() -> None:
    url, owner = sys.argv[1], sys.argv[2]
    database = Database(url)
    with database.scope() as session:  # connect before the start line, not after it
        session.connection()
    print("ready", flush=True)
    sys.stdin.readline()
    claimed: list[int] = []
    while True:
        with database.scope() as session:
            job = claim_next(session, owner=owner, lease_s=600)
            if job is None:
                break
            claimed.append(job.id)
    print(json.dumps(claimed), flush=True)


if __name__ == "__main__":
    main()
