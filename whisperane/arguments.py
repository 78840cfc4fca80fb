"""The transcription options as command-line flags, built from ``TranscribeOptions``' fields and their help
texts (``add_option_arguments``), and the options from parsed flags (``options_from_args``): one definition for
``transcribe``, ``stream`` and ``batch``."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from .errors import OptionsError
from .options import TranscribeOptions


def str2bool(v: str) -> bool:
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {v!r}")


def optional_float(v: str) -> float | None:
    return None if v.lower() == "none" else float(v)


def _argument_type(f) -> dict:
    """argparse keywords for a field, from its annotation (strings under ``from __future__``)."""
    kind = str(f.type)
    if kind == "bool":  # --flag, --flag True/False, --no-flag
        return {"type": str2bool, "nargs": "?", "const": True}
    if kind.startswith("float"):
        return {"type": optional_float if "None" in kind else float}
    if kind.startswith("int"):
        return {"type": int}
    return {"type": str}


def add_option_arguments(parser: argparse.ArgumentParser) -> None:
    """The transcription options as flags (``--best-of``...); temperature as openai-whisper's CLI has it."""
    for f in fields(TranscribeOptions):
        meta = dict(f.metadata)
        if meta.pop("cli", True) is False:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        parser.add_argument(flag, dest=f.name, default=default, **_argument_type(f), **meta)
        if str(f.type) == "bool":
            parser.add_argument("--no-" + flag[2:], dest=f.name, action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--speaker", dest="known_speakers", action="append", metavar="NAME=CLIP",
                        help="with --diarize: a known speaker's name and a reference clip of the voice (2-10 s); "
                             "repeatable")
    parser.add_argument("--temperature", type=float, default=0.0, help="first sampling temperature")
    parser.add_argument("--temperature-increment-on-fallback", type=optional_float, default=0.2,
                        help="added to the temperature on each fallback; none disables fallback")


def options_from_args(args: argparse.Namespace) -> TranscribeOptions:
    """TranscribeOptions from parsed flags; raises OptionsError for invalid values."""
    values = {f.name: getattr(args, f.name) for f in fields(TranscribeOptions) if f.metadata.get("cli", True)}
    if args.known_speakers:
        values["known_speakers"] = known_speakers(args.known_speakers)
    start, step = args.temperature, args.temperature_increment_on_fallback
    if step is not None and step <= 0:
        raise OptionsError("--temperature-increment-on-fallback must be > 0 (or none)")
    temps = [start]
    while step and temps[-1] + step <= 1.0 + 1e-6:
        temps.append(round(temps[-1] + step, 4))
    return TranscribeOptions(**values, temperature=tuple(temps))


def known_speakers(pairs: list[str]) -> dict[str, str]:
    """``--speaker NAME=CLIP`` flags as {name: clip}; OptionsError for a flag without ``=`` or a name given twice."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, clip = pair.partition("=")
        if not sep or not name or not clip:
            raise OptionsError(f"--speaker takes NAME=clip.wav, not {pair!r}")
        if name in out:
            raise OptionsError(f"--speaker {name} is given twice")
        out[name] = clip
    return out


__all__ = ["add_option_arguments", "known_speakers", "options_from_args", "str2bool"]
