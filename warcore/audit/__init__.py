"""The mechanical audit of boundary declarations.

* :mod:`~warcore.audit.matrix`: what ``warcore matrix`` and ``warcore check`` compute, every
  backend x mode x algorithm resolved, and the problems found in it (static; imports only the
  core);
* :mod:`~warcore.audit.sanitizer`: the WAR sanitizer, which poisons the shared buffers from each
  read-done point on and checks that no output changes (with its private
  :mod:`~warcore.audit._poison` and :mod:`~warcore.audit._sanitize_probe`);
* :mod:`~warcore.audit.bindings`: the binding audit, which checks that every wait on a
  read-done event bound to the record of the forward it meant;
* :mod:`~warcore.audit.tracer`: the read tracer, which says where a forward's last shared read
  really is;
* :mod:`~warcore.audit.soak`: a long random overlap run, every segment checked against serial
  tokens and sanitized;
* :mod:`~warcore.audit.trace_export`: an engine observer that records a run, turns it into a
  timeline (what the overlap benchmarks measure) and writes it as a Chrome/Perfetto trace.

:mod:`warcore.testing` is the public entry for plugin authors and imports from here.

May import ``warcore.core``, ``device``, ``batch``, ``attention``, ``runners`` and
``engine``; never ``warcore.cli`` or ``warcore.bench``. This file imports nothing, so that
importing ``warcore.audit.matrix`` stays light (the sanitizer and the tracer import torch).
"""
