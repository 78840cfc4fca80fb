"""The same app on Ray Serve: ``whisperane serve --ray-address ADDR --replicas N``.

Each replica is one Ray actor that loads the models once and runs the FastAPI app of ``create_app`` (its own
decode pool of ``--max-concurrency`` workers, as many CPUs reserved); Ray Serve's HTTP proxy in front spreads
the requests over the replicas. A model named by path must exist at that path on every node (or be a name whose
bundle each node has in its models directory).
"""

from __future__ import annotations

from pathlib import Path

from .. import WhisperaneError
from ..runtime.executors import map_large_allocations
from .app import ServerConfig, create_app
from .models import model_ids
from .scheduling import Schedule

APP_NAME = "whisperane"


class WhisperaneReplica:
    """One replica: the models loaded once for its schedule, the app built on them (Ray Serve's late-bound
    ingress)."""

    def __init__(self, names: list[str], config: ServerConfig, threads: int, encoder_threads: int):
        map_large_allocations()  # as ``whisperane serve`` does
        self.schedule = Schedule(threads, encoder_threads)
        self.models = self.schedule.load_models(names)
        self.config = config

    def __serve_build_asgi_app__(self):
        return create_app(self.models, self.config, self.schedule)


def deployment(names: list[str], config: ServerConfig, replicas: int, threads: int, encoder_threads: int):
    """The bound Ray Serve application: ``replicas`` copies of the app."""
    from ray import serve

    # A path is made absolute here: a replica's working directory is not the driver's.
    names = [str(Path(n).resolve()) if Path(n).is_dir() else n for n in names]
    model_ids(names)  # an error where two names have one id
    ingress = serve.ingress()(WhisperaneReplica)
    return serve.deployment(ingress, name="WhisperaneServer", num_replicas=replicas,
                            ray_actor_options={"num_cpus": config.workers * threads},
                            graceful_shutdown_timeout_s=config.shutdown_grace_s,
                            max_ongoing_requests=config.workers + config.queue).bind(
                                names, config, threads, encoder_threads)


def serve_on_ray(names: list[str], config: ServerConfig, address: str, replicas: int, host: str, port: int,
                 threads: int, encoder_threads: int) -> int:
    """Connect to the cluster at ``address`` ('local': start one here), start Serve's proxy on host:port, run
    the app until interrupted."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise WhisperaneError("Ray Serve is not installed: pip install 'whisperane[ray-serve]'") from None
    if replicas < 1:
        raise WhisperaneError("--replicas must be >= 1")
    ray.init(address=None if address == "local" else address, ignore_reinit_error=True, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(names, config, replicas, threads, encoder_threads), name=APP_NAME, route_prefix="/", blocking=True)
    return 0
