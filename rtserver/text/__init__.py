"""Text stage (pure): normalization for speech and incremental segmentation.

``normalize(text)`` itself lives in :mod:`rtserver.text.normalize` (not
re-exported here, so that the submodule's name stays the module).
"""

from rtserver.text.normalize import Normalizer, NormBuffer
from rtserver.text.segmenter import Segment, Segmenter, SegmenterConfig

__all__ = ["NormBuffer", "Normalizer", "Segment", "Segmenter", "SegmenterConfig"]
