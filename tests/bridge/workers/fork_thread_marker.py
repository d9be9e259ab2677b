"""Starts a thread when imported: a fork server must not fork from that."""

import threading
import time

threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
