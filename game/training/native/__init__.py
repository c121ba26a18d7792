"""The C and C++ sources the training code calls (kernels, transcript writer, dispatch front), with the
code that builds, loads and binds them."""
