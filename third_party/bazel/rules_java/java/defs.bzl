"""Offline stand-in for @rules_java, for Debian's Bazel 4.2.3.

@bazel_tools loads these names even for C++-only builds; binding them to the
native rules keeps Bazel from downloading the repository.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_lite_proto_library = native.java_lite_proto_library
java_proto_library = native.java_proto_library
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
