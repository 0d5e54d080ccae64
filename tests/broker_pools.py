"""Point this process's Celery app at another broker mid-run: Celery caches its connection pool and
its producer pool on first use, so both are dropped and the next call connects to the broker
configured now. Closing the pool instead (`pool.force_close_all()`) leaves the producer pool
holding a closed pool, and every later dispatch of the run fails with "Acquire on closed pool"."""

from celery import Celery


def forget_broker_connections(app: Celery) -> None:
    app._pool = None
    app.amqp._producer_pool = None
