"""Every measurement of the project in one place: benchmarks and the bands' calibration.

Why a room of its own: these modules measure the product (gas and disputes on a chain, training
overhead, log sizes, the replication matrix, the divergence bands) and need all of it, while no
product code needs them; keeping them apart keeps the layers one-way. Each module is one command of
``vgame bench`` (or ``vgame calibrate``):

* :mod:`game.bench.gas`: gas of every contract function and of a whole dispute (``bench gas``);
* :mod:`game.bench.dispute`: whole disputes timed on a chain (``bench game``);
* :mod:`game.bench.overhead`: a training step's cost against plain training (``bench overhead``);
* :mod:`game.bench.logsize`: the rounding log's size per step (``bench log``);
* :mod:`game.bench.replication`: train on every profile, audit on every other (``bench replication``);
* :mod:`game.bench.plot`: the benchmarks' figure from their JSON (``bench plot``);
* :mod:`game.bench.calibrate`: measuring the divergence bands (``vgame calibrate``).

Importing the package imports nothing: the chain benches stay torch-free.
"""
