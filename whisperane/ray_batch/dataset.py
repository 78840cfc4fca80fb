"""The Ray Data side of ``whisperane batch``: a Dataset of transcription rows, each actor one model."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..console import ModelUnavailable, describe_error
from ..errors import WhisperaneError
from ..util import file_sha256
from .inputs import rename_clashes
from .shards import RESULT_COLUMNS, RESULT_SCHEMA

if TYPE_CHECKING:
    import ray.data


class Transcriber:
    """One Ray actor: one model, loaded when the first readable file needs it (bad files fail fast)."""

    def __init__(self, bundle: str, model_name: str, threads: int, compute_type: str, options: dict):
        self.bundle, self.threads, self.compute_type, self.options = bundle, threads, compute_type, options
        self.model_name = model_name
        self.options_json = json.dumps({"compute_type": compute_type, **options}, sort_keys=True)
        self.model = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        records = [self.transcribe_file(path) for path in batch.column("path").to_pylist()]
        results = pa.Table.from_pylist(records, schema=RESULT_SCHEMA)
        for name in RESULT_COLUMNS:
            batch = batch.append_column(RESULT_SCHEMA.field(name), results.column(name))
        return batch

    def transcribe_file(self, path: str) -> dict:
        import whisperane
        from whisperane.audio import open_audio

        row: dict[str, Any] = {"model": self.model_name, "options": self.options_json}
        try:
            row["sha256"] = file_sha256(path)
            with open_audio(path):  # a bad file fails here, before the model is loaded
                pass
            # By path, as the CLI: transcribe() floors each window's log-mel from the file's peak (a first pass over
            # the file), where a stream it is given keeps each window's own.
            result = whisperane.transcribe(path, model=self._model(), **self.options)
            return {**row, **result.to_dict()}
        except ModelUnavailable:
            raise  # no file can be transcribed: the run stops with this error
        except WhisperaneError as e:
            return {**row, "error": str(e)}
        except OSError as e:
            return {**row, "error": f"{path}: {describe_error(e)}"}
        except Exception as e:  # noqa: BLE001 - one bad file must not end the run
            return {**row, "error": f"{path}: internal error ({describe_error(e)})"}

    def _model(self):
        if self.model is None:
            import whisperane

            try:
                self.model = whisperane.load_model(self.bundle, threads=self.threads, compute_type=self.compute_type)
            except WhisperaneError as e:
                raise ModelUnavailable(f"on node {os.uname().nodename}: {e}") from None
        return self.model


def transcribe_dataset(
    data: ray.data.Dataset | Sequence[str | os.PathLike],
    model: str | os.PathLike = "tiny.en",
    *,
    workers: int = 1,
    threads_per_worker: int = 1,
    compute_type: str = "default",
    files_per_block: int = 1,
    model_label: str | None = None,
    **options: Any,
) -> ray.data.Dataset:
    """A Ray Dataset of transcription rows: the input's columns (those named like a result column renamed
    ``input_<name>``) plus ``text``, ``language``, ``duration``, ``language_probs``, ``segments``,
    ``error``, ``sha256``, ``model`` and ``options`` (see ``ray_batch.shards.RESULT_SCHEMA``).

    ``data``: a Dataset with a ``path`` column (files readable on every node), or a list of paths.
    ``model`` is resolved to a bundle here, once (converted on first use); the actors load that bundle, so on
    a cluster it must sit at the same path on every node (a shared filesystem). ``options`` are
    ``TranscribeOptions`` fields. Lazy, like any Dataset: iterate, write or materialize it.
    """
    import ray.data

    from ..loading import resolve_bundle
    from ..options import TranscribeOptions

    option_kwargs = dataclasses.asdict(TranscribeOptions(**options))  # bad options fail here, in the driver, once
    bundle = resolve_bundle(model)
    if not isinstance(data, ray.data.Dataset):
        paths = [os.path.abspath(p) for p in data]
        data = ray.data.from_arrow([pa.table({"path": pa.array(paths[i : i + files_per_block], pa.string())})
                                    for i in range(0, len(paths), files_per_block)])
    renames = rename_clashes(data.columns(), RESULT_COLUMNS)
    if renames:
        data = data.rename_columns(renames)
    return data.map_batches(
        Transcriber,
        fn_constructor_kwargs={"bundle": str(bundle), "model_name": model_label or str(model), "threads": threads_per_worker,
                               "compute_type": compute_type, "options": option_kwargs},
        batch_format="pyarrow",
        batch_size=1,  # a block's files one at a time; blocks are what actors share out
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=threads_per_worker,
    )
