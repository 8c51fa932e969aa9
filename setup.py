"""Build glue: everything declarative lives in pyproject.toml; this file only
names the cffi builder so setuptools compiles csrc/ into mpicoll._kernels."""
from setuptools import setup

setup(cffi_modules=["csrc/build_kernels.py:ffibuilder"])
