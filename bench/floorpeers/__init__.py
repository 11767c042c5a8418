"""bench/floor.py and bench/peers.py: the shared parent side (:mod:`.common`: own venvs, load
gating, percentiles, results) and the children run inside those venvs (:mod:`.floor_child`,
:mod:`.peers_child`; they import only numpy, their libraries and :mod:`.corpus`)."""
