"""The simulated GPU node (simulated.py, with its reads in C, simulated_nvml.c) and a stand-in libnvidia-ml for pynvml
(fake_libnvml.py)."""
