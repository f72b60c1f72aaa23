"""Reading ``config.pbtxt`` into the ``ModelConfig`` message, and its JSON form.

Parsing is protobuf's ``text_format``; a syntax error becomes a
:class:`~repository_loader.errors.ConfigError` naming the file, line and column.
The JSON form uses Triton's field names (``max_batch_size``, ``data_type``) and
plain numbers for 64-bit integer fields, as Triton's ``GET .../config`` does;
it parses back into an equal message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from repository_loader.errors import ConfigError
from repository_loader.proto import model_config_pb2 as pb

ModelConfig = pb.ModelConfig

CONFIG_FILENAME = "config.pbtxt"
CUSTOM_CONFIG_DIR = "configs"

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def parse_config(text: str, source: str = CONFIG_FILENAME) -> pb.ModelConfig:
    """Parse the text form of a model configuration.

    ``source`` names the file in error messages, e.g. ``'m/config.pbtxt:3:7: ...'``.
    """
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(_describe_parse_error(exc, source)) from None
    _normalize_aliases(config)
    return config


def _describe_parse_error(exc: text_format.ParseError, source: str) -> str:
    line, column = exc.GetLine(), exc.GetColumn()
    message = str(exc)
    # protobuf prefixes the message with "line:column : "; keep only the reason.
    prefix = f"{line}:{column} : "
    if message.startswith(prefix):
        message = message[len(prefix) :]
    message = _friendlier(message)
    if line is None:
        return f"{source}: syntax error: {message}"
    return f"{source}:{line}:{column}: syntax error: {message}"


def _friendlier(message: str) -> str:
    """Say "unknown data type" for a bad enum name, and drop the schema's package name."""
    match = _BAD_DATA_TYPE.search(message)
    if match:
        return f"unknown data type '{match.group(1)}' (expected one of {', '.join(_DATA_TYPE_NAMES)})"
    return message.replace(f"{pb.DESCRIPTOR.package}.", "")


_BAD_DATA_TYPE = re.compile(r'Enum type "[\w.]*\.DataType" has no value named (\w+)')
_DATA_TYPE_NAMES = [v.name for v in pb.DataType.DESCRIPTOR.values if v.number != 0]


def _normalize_aliases(config: pb.ModelConfig) -> None:
    """Fold fields that Triton releases spell differently into their canonical field."""
    if config.HasField("ensemble_scheduling"):
        ens = config.ensemble_scheduling
        if ens.max_inflight_responses and not ens.max_inflight_requests:
            ens.max_inflight_requests = ens.max_inflight_responses
        ens.ClearField("max_inflight_responses")


def config_to_text(config: pb.ModelConfig) -> str:
    """The ``config.pbtxt`` text form of ``config``."""
    return str(text_format.MessageToString(config))


def config_to_json(config: pb.ModelConfig) -> dict[str, Any]:
    """The JSON form Triton reports: proto field names, default values included."""
    data = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _int64_as_numbers(config.DESCRIPTOR, data)
    data.get("ensemble_scheduling", {}).pop("max_inflight_responses", None)
    return data


def config_from_json(data: Mapping[str, Any], source: str = "config JSON") -> pb.ModelConfig:
    """Parse the JSON form (as :func:`config_to_json` writes it) back into a message."""
    config = pb.ModelConfig()
    try:
        json_format.ParseDict(_lists_for_repeated(config.DESCRIPTOR, data), config)
    except json_format.ParseError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    _normalize_aliases(config)
    return config


def _lists_for_repeated(descriptor: Descriptor, data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with a lone value of a repeated field as a list of that one value, at every depth:
    Triton's JSON parser takes ``"instance_group": {"count": 2}`` as a group of one, protobuf's
    Python parser refuses it."""
    out = dict(data)
    for name, value in out.items():
        field = descriptor.fields_by_name.get(name) or descriptor.fields_by_camelcase_name.get(name)
        if field is None:
            continue
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        repeated = field.label == FieldDescriptor.LABEL_REPEATED and not is_map
        if repeated and value is not None and not isinstance(value, list):
            value = [value]
        if field.message_type is not None and not is_map:
            if isinstance(value, list):
                value = [
                    _lists_for_repeated(field.message_type, v) if isinstance(v, Mapping) else v for v in value
                ]
            elif isinstance(value, Mapping):
                value = _lists_for_repeated(field.message_type, value)
        out[name] = value
    return out


def _int64_as_numbers(descriptor: Descriptor, data: dict[str, Any]) -> None:
    """protobuf writes 64-bit integers as JSON strings; Triton writes numbers."""
    for name, value in data.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _map_values(field.message_type, value)
        elif field.message_type is not None:
            for item in value if isinstance(value, list) else [value]:
                _int64_as_numbers(field.message_type, item)
        elif field.type in _INT64_TYPES:
            data[name] = [int(v) for v in value] if isinstance(value, list) else int(value)


def _map_values(entry: Descriptor, mapping: dict[str, Any]) -> None:
    value_field = entry.fields_by_name["value"]
    for key, value in mapping.items():
        if value_field.message_type is not None:
            _int64_as_numbers(value_field.message_type, value)
        elif value_field.type in _INT64_TYPES:
            mapping[key] = int(value)


def config_path_candidates(model_dir: str, config_name: str | None, join: Any) -> list[str]:
    """Config files to try for a model, in order (Triton's ``--model-config-name`` rule).

    With a custom name, ``configs/<name>.pbtxt`` comes first, then ``config.pbtxt``.
    """
    candidates = []
    if config_name:
        candidates.append(join(model_dir, CUSTOM_CONFIG_DIR, f"{config_name}.pbtxt"))
    candidates.append(join(model_dir, CONFIG_FILENAME))
    return candidates


def parse_labels(text: str) -> list[str]:
    """The labels of a label file: one per line, trailing blank lines dropped."""
    labels = text.splitlines()
    while labels and not labels[-1].strip():
        labels.pop()
    return labels
