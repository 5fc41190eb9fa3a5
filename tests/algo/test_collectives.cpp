// The collectives sweep (harness.hpp) for every algorithm in algorithms.hpp.
// meson runs each collective as its own test, filtered by test-case name.
#include "harness.hpp"

using gradsync::test::collective;
using gradsync::test::plan;
using gradsync::test::sweep;

TEST_CASE("allreduce: small counts") { sweep(collective::allreduce, plan::small); }
TEST_CASE("allreduce: medium count, many segments") { sweep(collective::allreduce, plan::medium); }
TEST_CASE("allreduce: large count") { sweep(collective::allreduce, plan::large); }

TEST_CASE("reduce_scatter: small counts") { sweep(collective::reduce_scatter, plan::small); }
TEST_CASE("reduce_scatter: medium count, many segments") { sweep(collective::reduce_scatter, plan::medium); }
TEST_CASE("reduce_scatter: large count") { sweep(collective::reduce_scatter, plan::large); }

TEST_CASE("allgather: small counts") { sweep(collective::allgather, plan::small); }
TEST_CASE("allgather: medium count, many segments") { sweep(collective::allgather, plan::medium); }
TEST_CASE("allgather: large count") { sweep(collective::allgather, plan::large); }

TEST_CASE("broadcast: small counts") { sweep(collective::broadcast, plan::small); }
TEST_CASE("broadcast: medium count, many segments") { sweep(collective::broadcast, plan::medium); }
TEST_CASE("broadcast: large count") { sweep(collective::broadcast, plan::large); }

TEST_CASE("reduce: small counts") { sweep(collective::reduce, plan::small); }
TEST_CASE("reduce: medium count, many segments") { sweep(collective::reduce, plan::medium); }
TEST_CASE("reduce: large count") { sweep(collective::reduce, plan::large); }
