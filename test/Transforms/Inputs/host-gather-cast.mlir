// An offloaded unit's bucket of two f32 shards, gathered in bf16 on a GPU:
// 10,000,000 and 500,000 elements per shard (40 MB and 2 MB in host memory).
module attributes {fsdp.device = "cuda"} {
  shard.grid @dp(shape = 2)
  fsdp.unit @root root
  fsdp.unit @l0 offloaded
  fsdp.param @a : tensor<20000x1000xf32> unit @l0 sharded on @dp axes = [0] padding = 0
  fsdp.param @b : tensor<1000x1000xf32> unit @l0 sharded on @dp axes = [0] padding = 0
  func.func @train_step(%x: tensor<1x1000xbf16>) -> tensor<f32> {
    %sa = fsdp.get_param @a : tensor<10000x1000xf32>
    %sb = fsdp.get_param @b : tensor<500x1000xf32>
    %f = fsdp.all_gather_start %sa, %sb on @dp axes = [0] unit @l0 host : tensor<10000x1000xf32>, tensor<500x1000xf32> -> !fsdp.future<tensor<20000x1000xbf16>, tensor<1000x1000xbf16>>
    %a, %b = fsdp.wait %f : !fsdp.future<tensor<20000x1000xbf16>, tensor<1000x1000xbf16>>
    %y = fsdp.aten "aten::mm" (%x, %b) : (tensor<1x1000xbf16>, tensor<1000x1000xbf16>) -> tensor<1x1000xbf16>
    %s = fsdp.aten "aten::sum" (%y) : (tensor<1x1000xbf16>) -> tensor<bf16>
    %l = fsdp.cast %s : tensor<bf16> to tensor<f32>
    fsdp.reshard %a, %b : tensor<20000x1000xbf16>, tensor<1000x1000xbf16>
    fsdp.release %y : tensor<1x1000xbf16>
    fsdp.loss %l : tensor<f32>
    return %l : tensor<f32>
  }
}
