"""The runtime: devices, compiling and launching kernels of any family, and their workspaces.

:mod:`.limits` and :mod:`.device` describe a GPU, :mod:`.abi` a kernel's parameter list,
:mod:`.compiler` compiles (NVRTC) and launches through :mod:`.driver` (ctypes), :mod:`.workspace`
hands out tile counters, and :mod:`.offline` compiles with nvcc where there is no GPU.
"""
