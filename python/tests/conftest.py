"""Keeps the test run's caches out of $HOME, as the Rust tests do: the autotuner's choices
(WGPU_ATTENTION_TUNE_CACHE) and Mesa's shader cache (MESA_SHADER_CACHE_DIR) go to one
temporary directory for the session, unless the environment already points them somewhere.
Set before `wgpu_attention` is imported (pytest loads this file first), so the device the
package opens sees them."""

import os
import tempfile

_CACHE = tempfile.mkdtemp(prefix="wgpu-attention-pytest-")
os.environ.setdefault("WGPU_ATTENTION_TUNE_CACHE", os.path.join(_CACHE, "tune.json"))
os.environ.setdefault("MESA_SHADER_CACHE_DIR", os.path.join(_CACHE, "mesa"))
os.environ.setdefault("NODEVICE_SELECT", "1")
