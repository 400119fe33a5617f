shard.grid @dp(shape = 4)
fsdp.unit @root root
fsdp.param @"head.weight" : tensor<10x8xf32> unit @root sharded on @dp axes = [0] padding = 2
func.func @gather_head() -> tensor<10x8xf32> {
  %shard = fsdp.get_param @"head.weight" : tensor<3x8xf32>
  %pending = fsdp.all_gather_start %shard on @dp axes = [0] unit @root
      : tensor<3x8xf32> -> !fsdp.future<tensor<10x8xbf16>>
  %full = fsdp.wait %pending : !fsdp.future<tensor<10x8xbf16>>
  %out = fsdp.cast %full : tensor<10x8xbf16> to tensor<10x8xf32>
  fsdp.reshard %full : tensor<10x8xbf16>
  return %out : tensor<10x8xf32>
}
