"""A correct backend that tiles its paged layouts apart: NHD pages are numpy-tiled's key blocks, HND
caches are gathered into a padded batch and run in its 64-key blocks.  The same keys in the same order,
summed in other groupings: equal within rounding, not bit for bit (paged_layouts_agree must accept it)."""
from __future__ import annotations

from dataclasses import replace

from attnspec.backends import numpy_formats
from attnspec.backends.numpy_backends import NumpyTiled
from attnspec.specs.formats import split_layout


class LayoutsTiledApart(NumpyTiled):
    name = "layouts-tiled-apart"
    capabilities = replace(NumpyTiled.capabilities, dtypes=("float32",))

    def native_paged(self, q, k_cache, v_cache, args, call):
        if split_layout(args.layout)[1] == "HND":
            return numpy_formats.gathered_paged(self, q, k_cache, v_cache, args, call)
        return numpy_formats.tiled_paged(self, q, k_cache, v_cache, args, call)
