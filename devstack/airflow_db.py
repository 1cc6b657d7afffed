"""SQLite settings for the embedded Airflow, where five processes share one database file.

sqlite3 gives up on a locked database after 5 s, and Airflow's API server answers that with a 503
in the middle of a request (a backfill half created, then rolled back). Waiting longer for the lock
turns those into slower requests. Airflow reads this by import path
(``[database] sql_alchemy_connect_args``); a real deployment uses PostgreSQL and none of this.
"""

#: ``sqlite3.connect(timeout=...)``: seconds to wait for a lock before "database is locked"
CONNECT_ARGS = {"timeout": 60}
