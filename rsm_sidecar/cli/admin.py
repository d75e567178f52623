"""Small administrative commands: `config docs|check` and `keys generate`."""

from __future__ import annotations

import json
import os
import sys

from rsm_sidecar.cli.main import command_group
from rsm_sidecar.config import Config, all_keys, docs_markdown
from rsm_sidecar.errors import ConfigError


def register(sub) -> None:
    csub = command_group(
        sub,
        "config",
        "configuration reference and validation",
        "The sidecar's configuration: `check` a file as `serve` would, or print the reference of "
        "every key (`docs`). Guide: docs/configuration.md.",
    )
    d = csub.add_parser("docs", help="print the configuration reference (Markdown) generated from the code")
    d.set_defaults(func=lambda a: print(docs_markdown()) or 0)
    c = csub.add_parser(
        "check",
        help="validate a configuration file and print the effective values",
        description="Validate a configuration file (with RSM__ environment overrides) as `serve` would "
        "at start-up, without touching storage: values, the files it names (keys, certificates) and "
        "the directories it needs. Prints the effective values (secrets hidden) on stdout and each "
        "problem on stderr; exits 1 when there is one (docs/configuration.md).",
    )
    c.add_argument("--config", "-c", required=True, help="the sidecar's TOML configuration file to check")
    c.set_defaults(func=_check)

    ksub = command_group(
        sub,
        "keys",
        "key-encryption keys",
        "RSA key pairs for the keyring ([encryption.keys.<id>]), which wrap each segment's data "
        "key. Generating, adding and rotating keys: docs/operations-keys.md.",
    )
    g = ksub.add_parser("generate", help="create an RSA key pair for the keyring")
    g.add_argument("--id", required=True, help="key id (letters, digits, - and _)")
    g.add_argument("--out", required=True, help="directory for <id>.public.pem and <id>.private.pem")
    g.add_argument(
        "--bits", type=int, default=3072, help="RSA key size in bits (default 3072; at least 2048)"
    )
    g.set_defaults(func=_generate)


def _check(args) -> int:
    cfg = Config.load(args.config)
    json.dump(cfg.redacted(), sys.stdout, indent=2, default=str)
    print()
    errors, notes = file_problems(cfg)
    for note in notes:
        print(f"rsm-sidecar: note: {note}", file=sys.stderr)
    for error in errors:
        print(f"rsm-sidecar: error: {error}", file=sys.stderr)
    return 1 if errors else 0


#: path keys naming directories (the rest name files); the sidecar creates these when missing
_DIRECTORY_SUFFIXES = ("_dir", ".path", ".root")


def file_problems(cfg: Config) -> tuple[list[str], list[str]]:
    """(errors, notes) about the files and directories ``cfg`` names, as ``serve`` and the jobs
    would meet them: a file that is read must exist (key files only while encryption is on, a
    backend's files only for the configured backend), and, where it can be checked without
    reading keys, the keyring must load; a directory the sidecar creates may be missing if it can
    be created (a note), not if it cannot."""
    errors: list[str] = []
    notes: list[str] = []
    backend = cfg["storage.backend"]
    keys = [k for k in all_keys() if k.type == "path"]
    for path in sorted(cfg.redacted()):
        key = next((k for k in keys if k.path == path or ("<" in k.path and k.pattern().match(path))), None)
        value = cfg[path]
        if key is None or not value:
            continue
        if path.startswith("encryption.keys.") and not cfg["encryption.enabled"]:
            continue
        if path.startswith("storage.") and path.split(".")[1] != backend:
            continue
        where = os.path.abspath(value)
        if path.endswith(_DIRECTORY_SUFFIXES):
            if os.path.isdir(where):
                continue
            if os.path.exists(where):
                errors.append(f"{path}: {where} is not a directory")
                continue
            parent = os.path.dirname(where)
            while not os.path.exists(parent):
                parent = os.path.dirname(parent)
            if os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK):
                notes.append(f"{path}: {where} does not exist yet; the sidecar creates it")
            else:
                errors.append(
                    f"{path}: {where} does not exist, and this user cannot create it (its parent "
                    f"{parent} is not a writable directory)"
                )
        elif not os.path.isfile(where):
            what = "is not a file" if os.path.exists(where) else "does not exist"
            errors.append(f"{path}: {where} {what}")
    if not any(e.startswith("encryption.") for e in errors):
        from rsm_sidecar.transform.keyring import Keyring

        try:
            Keyring.from_config(cfg)
        except ConfigError as e:
            errors.append(str(e))
    return errors, notes


def _generate(args) -> int:
    from rsm_sidecar.transform.keyring import write_key_pair

    os.makedirs(args.out, exist_ok=True)
    pub_path = os.path.join(args.out, f"{args.id}.public.pem")
    priv_path = os.path.join(args.out, f"{args.id}.private.pem")
    write_key_pair(pub_path, priv_path, args.bits)
    print(
        f'[encryption.keys.{args.id}]\npublic_key_file = "{os.path.abspath(pub_path)}"\n'
        f'private_key_file = "{os.path.abspath(priv_path)}"'
    )
    return 0
