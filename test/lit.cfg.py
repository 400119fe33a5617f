# -*- Python -*-
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "FSDPC"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.fsdp_obj_root, "test")
config.excludes = ["Inputs", "unit", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]

llvm_config.with_system_environment(["HOME", "TMP", "TEMP"])
llvm_config.use_default_substitutions()
# `not`, `count` and FileCheck at the start of a RUN line are found through PATH.
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
config.substitutions.append(("%examples", os.path.join(config.fsdp_src_root, "examples")))

# The Python frontend: `%venv_python -m fsdpc ...` with the package from the source tree.
config.substitutions.append(("%venv_python", config.fsdp_python))
config.environment["PYTHONPATH"] = os.path.join(config.fsdp_src_root, "python")
config.environment["FSDP_OPT"] = os.path.join(config.fsdp_obj_root, "bin", "fsdp-opt")

tool_dirs = [os.path.join(config.fsdp_obj_root, "bin"), config.llvm_tools_dir]
llvm_config.add_tool_substitutions(["fsdp-opt", "fsdp-translate"], tool_dirs)
