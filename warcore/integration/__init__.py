"""What every engine integration needs, in one place (torch-free).

An integration (warcore-sglang, warcore-vllm) patches a real engine it has audited, release by
release. The parts that do not depend on the engine live here, each in its own module:

* :mod:`~warcore.integration.engine_code`: is the engine's code the code that was audited?
  Signatures and digests of functions, read from an imported module or from a release's source
  without importing it;
* :mod:`~warcore.integration.checks`: the structural checks beyond digests, as data;
* :mod:`~warcore.integration.releases`: an engine's audited releases as data, and the gate that
  admits the installed one exactly; the engines registered under ``warcore.integrations``;
* :mod:`~warcore.integration.release_diff`, :mod:`~warcore.integration.wheel` and
  :mod:`~warcore.integration.source_code`: a new release's wheel, read without importing it,
  against the nearest audited one, and a draft entry for it (``warcore release``);
* :mod:`~warcore.integration.post_import`: run a callback right after a module's first import;
* :mod:`~warcore.integration.patching`: patch an engine so that it can be put back exactly;
* :mod:`~warcore.integration.lifecycle`: the activation (install, settle once every watched
  module's checks ran, take off, restore);
* :mod:`~warcore.integration.settings`: switches and numbers from the environment, and the
  start-up line.

Imports the standard library, ``packaging`` and :mod:`warcore.core` only (an import-linter
layer right above the core, below everything that runs a forward); the engine plugins build on
it.
"""

from .lifecycle import Activation
from .releases import Engine, Release, UnsupportedRelease, pick

__all__ = ["Activation", "Engine", "Release", "UnsupportedRelease", "pick"]
