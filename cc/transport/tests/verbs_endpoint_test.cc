// The endpoint text a peer publishes is parsed as untrusted input.
#include "cc/transport/verbs_endpoint.h"

#include <string>
#include <vector>

#include "cc/transport/tests/bridge_pair.h"
#include "gtest/gtest.h"

namespace hetjax::verbs {
namespace {

Endpoint Sample(uint32_t qp) {
  Endpoint e;
  e.qp_num = qp;
  e.psn = 0xabcdef;
  e.lid = 7;
  for (int i = 0; i < 16; ++i) e.gid[i] = static_cast<uint8_t>(i * 17);
  e.mtu = 3;
  e.ring_addr = 0x7f0012345000;
  e.ring_rkey = 0xdeadbeef;
  e.ring_bytes = 4 << 20;
  return e;
}

TEST(VerbsEndpointTest, RoundTripsSeveralQueuePairs) {
  std::vector<Endpoint> out;
  ASSERT_TRUE(
      DecodeEndpoints(EncodeEndpoints({Sample(17), Sample(18)}), &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].qp_num, 18u);
  EXPECT_EQ(out[0].psn, 0xabcdefu);
  EXPECT_EQ(out[0].gid[15], 255);
  EXPECT_EQ(out[0].ring_addr, 0x7f0012345000u);
  EXPECT_EQ(out[0].ring_rkey, 0xdeadbeefu);
  EXPECT_EQ(out[0].ring_bytes, 4u << 20);
}

TEST(VerbsEndpointTest, RefusesWhatIsMalformedNamingTheField) {
  const std::string good = EncodeEndpoints({Sample(17)});
  std::vector<Endpoint> out;
  struct Case {
    std::string text, expect;
  };
  std::vector<Case> cases = {
      {"", "expected version hv1"},
      {"hv2" + good.substr(3), "expected version hv1"},
      {"hv1", "no queue pairs"},
      {"hv1;1,2,3", "has 3 fields"},
      {"hv1;1000000,1,0," + std::string(32, '0') + ",3,0,0,1000",
       "bad qp number"},
      {"hv1;1,1,0," + std::string(31, '0') + ",3,0,0,1000", "32 hex digits"},
      {"hv1;1,1,0," + std::string(32, 'g') + ",3,0,0,1000", "bad gid"},
      {"hv1;1,1,0," + std::string(32, '0') + ",9,0,0,1000", "bad mtu"},
      {"hv1;1,1,0," + std::string(32, '0') + ",3,0,0,80000000",
       "bad ring size"},
      {"hv1;1,1,0," + std::string(32, '0') + ",3,-1,0,1000",
       "bad ring address"},
  };
  for (const Case& c : cases) {
    Status s = DecodeEndpoints(c.text, &out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_CONTAINS(s.message(), c.expect);
  }
  std::string many = "hv1";
  for (int i = 0; i < 65; ++i) many += good.substr(3);
  EXPECT_CONTAINS(DecodeEndpoints(many, &out).message(), "too many entries");
}

}  // namespace
}  // namespace hetjax::verbs
