"""Session-wide fixtures."""

from tests.keys_fixture import rsa_keys
