"""Small administrative commands: `config docs|check` and `keys generate`."""

from __future__ import annotations

import json
import os
import sys

from rsm_sidecar.config import Config, docs_markdown


def register(sub) -> None:
    p = sub.add_parser("config", help="configuration reference and validation")
    csub = p.add_subparsers(dest="config_command", required=True)
    d = csub.add_parser("docs", help="print the configuration reference (Markdown) generated from the code")
    d.set_defaults(func=lambda a: print(docs_markdown()) or 0)
    c = csub.add_parser("check", help="validate a configuration file and print the effective values")
    c.add_argument("--config", "-c", required=True)
    c.set_defaults(func=_check)

    k = sub.add_parser("keys", help="key-encryption keys")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    g = ksub.add_parser("generate", help="create an RSA key pair for the keyring")
    g.add_argument("--id", required=True, help="key id (letters, digits, - and _)")
    g.add_argument("--out", required=True, help="directory for <id>.public.pem and <id>.private.pem")
    g.add_argument("--bits", type=int, default=3072)
    g.set_defaults(func=_generate)


def _check(args) -> int:
    cfg = Config.load(args.config)
    json.dump(cfg.redacted(), sys.stdout, indent=2, default=str)
    print()
    return 0


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
