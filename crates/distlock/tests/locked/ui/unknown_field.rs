struct Order {
    concert_id: u64,
}

#[distlock::locked(locks = locks, name = "concert:{req.nope}")]
async fn order(locks: &distlock::Locks, req: Order) -> distlock::Result<u64> {
    Ok(req.concert_id)
}

fn main() {}
