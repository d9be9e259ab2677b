"""Not a bridge rank: knocks on the rendezvous with the wrong secret.

It must be refused; the real ranks (roundtrip-style ping) keep working.
"""

import os
import sys

from hetjax.bridge.rendezvous import RendezvousClient
from hetjax.errors import AuthenticationError


def main():
    try:
        RendezvousClient(os.environ["HETJAX_COORDINATOR"], b"not-the-secret", rank=1, timeout_s=30)
    except AuthenticationError as e:
        print(f"OK rogue refused: {e}")
        return 0
    print("rogue was let in")
    return 1


if __name__ == "__main__":
    sys.exit(main())
