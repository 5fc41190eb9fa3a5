// gradsync: the decentralized (gossip) family in one include: topologies
// and their checks (gossip/topology.hpp), neighbour averaging
// (gossip/neighbor_allreduce.hpp), push-sum for directed graphs
// (gossip/push_sum.hpp), compressed CHOCO-Gossip (gossip/choco.hpp),
// hierarchical gossip (gossip/hierarchical_gossip.hpp) and its sharded form
// (gossip/sharded_gossip.hpp). docs/gossip.md.
#pragma once

#include "gossip/choco.hpp"
#include "gossip/exchange.hpp"
#include "gossip/hierarchical_gossip.hpp"
#include "gossip/neighbor_allreduce.hpp"
#include "gossip/options.hpp"
#include "gossip/push_sum.hpp"
#include "gossip/sharded_gossip.hpp"
#include "gossip/topology.hpp"
