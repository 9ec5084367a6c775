"""Keras 3 (off TensorFlow): keras.ops.dot_product_attention returns float32 for float64 input.

Undocumented in the op's docstring ("An array of the attention output with the same shape of
query"); Keras' dtype policy maps float64 to float32 on every backend but TensorFlow
(keras/src/backend/common/dtypes.py, BIT64_TO_BIT32_DTYPE).
"""
import os

from _common import need, verdict

os.environ.setdefault("KERAS_BACKEND", "numpy")
keras = need("keras")
import numpy as np  # noqa: E402

if keras.backend.backend() == "tensorflow":
    print("SKIPPED: on TensorFlow float64 stays float64")
    raise SystemExit(77)
q = np.random.default_rng(0).standard_normal((1, 3, 2, 4))  # float64 (B, T, N, H)
out = keras.ops.dot_product_attention(q, q, q)
dtype = keras.backend.standardize_dtype(out.dtype)
verdict(dtype == "float32", f"keras {keras.__version__} ({keras.backend.backend()} backend): float64 in, {dtype} out")
