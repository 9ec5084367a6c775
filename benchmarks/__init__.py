"""attnspec's asv benchmarks (benchmarks/README.md).

asv.conf.json uses launch_method "forkserver": asv starts one server process that imports this
package, and every parameter combination runs in a process forked from it.  In that server (and
only there: `python -m asv.benchmark run_server ...`) the selected backends' frameworks are
imported once, so a combination starts without paying an import of torch or jax (what a fork
saves: docs/measurements.md); the fork-unsafe state (JAX's client, torch's thread pool, CUDA) is created in each child.
"""
import sys

if sys.argv[1:2] == ["run_server"]:
    from attnspec.benchmarks import _common, _threads

    _threads.preload(_common.backend_names())
