"""Offline stand-in for @rules_cc, for Debian's Bazel 4.2.3.

Bazel 4 loads these names from @rules_cc and would download the repository
on first use; the real rules are native in this version anyway, so each name
is bound to its native rule. (Debian's bazel-rules-cc is too new for 4.2.3.)
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_proto_library = native.cc_proto_library
cc_shared_library = getattr(native, "cc_shared_library", None)
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
